"""The peft LiPO trainer on the tiny model, without a database."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from counselor_engine.lipo.config import LipoConfig
from counselor_engine.torchkit import render_prompt, response_logprobs
from training_worker.trainer import LipoTrainer, TrainGroup, to_edges
from training_worker.validation import check_crisis_path, preference_accuracy

CONFIG = LipoConfig(lora_rank=4, learning_rate=5e-3, steps=2, beta=0.5, max_length=64)
EDGES = [{"winner": 0, "loser": 1, "weight": 0.6}, {"winner": 0, "loser": 2, "weight": 0.5}]


def groups(n: int = 4) -> list[TrainGroup]:
    return [
        TrainGroup(
            key=f"g{i}",
            modality="cbt",
            prompt=[
                {"role": "system", "content": "You are a warm, careful counselor."},
                {"role": "user", "content": f"I feel sad since the move ({'x' * i})."},
            ],
            candidates=[
                "It makes sense that you feel this way.",
                "Rating 3 of 5.",
                "Which option fits better, A or B?" * (1 + i % 2),
            ],
            edges=to_edges(EDGES, 3),
        )
        for i in range(n)
    ]


def base_weights(trainer: LipoTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_" not in k}


def test_a_step_moves_the_adapter_and_never_the_base(tiny_model_dir):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG)
    prepared = trainer.prepare(groups())
    reference = trainer.reference(prepared)
    base = base_weights(trainer)

    first = trainer.step(prepared, reference)

    # Step 0: a fresh LoRA is the identity, so h = 0 and Eq. 6 = mean_g sum_e w softplus(0)/|E|.
    assert first.finite and first.loss == pytest.approx((0.6 + 0.5) * math.log(2) / 2, rel=1e-5)
    after = trainer.lora_state()
    assert any(not torch.equal(trainer.initial_state[k], after[k]) for k in after)
    assert all(torch.equal(v, base_weights(trainer)[k]) for k, v in base.items())
    assert trainer.step(prepared, reference).loss < first.loss


def test_the_reference_is_the_frozen_backbone_even_with_a_parent(tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from counselor_engine.backends.tiny import build_tiny_adapter

    parent = build_tiny_adapter(tiny_model_dir, tmp_path / "parent", seed=1)
    trainer = LipoTrainer(tiny_model_dir, parent=parent, config=CONFIG)
    prepared = trainer.prepare(groups(2))

    reference = trainer.reference(prepared)

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    with torch.no_grad():
        for item, ref in zip(prepared, reference, strict=True):
            n = len(item.group.candidates)
            expected = response_logprobs(
                plain,
                trainer.tokenizer,
                [render_prompt(trainer.tokenizer, _chat(item.group))] * n,
                list(item.group.candidates),
                max_length=CONFIG.max_length,
            )
            assert torch.allclose(ref, expected, atol=1e-5)
    policy = trainer.sequence_logprobs(prepared, adapter=True)
    assert not torch.allclose(policy[0], reference[0])  # the parent adapter is active


def test_micro_batching_gives_the_same_update_as_one_batch(tiny_model_dir):  # type: ignore[no-untyped-def]
    data = groups(5)
    states = []
    for budget in (10_000, 1):  # everything in one pass / one group per pass
        trainer = LipoTrainer(
            tiny_model_dir,
            parent=None,
            config=replace(CONFIG, micro_batch_tokens=budget),
        )
        prepared = trainer.prepare(data)
        reference = trainer.reference(prepared)
        stats = [trainer.step(prepared, reference) for _ in range(2)]
        states.append((trainer.lora_state(), stats, len(trainer.plan(prepared))))
    (one, stats_one, passes_one), (many, stats_many, passes_many) = states
    assert (passes_one, passes_many) == (1, 5)
    assert stats_one[1].loss == pytest.approx(stats_many[1].loss, rel=1e-4)
    # Equal to float32 rounding of the accumulated gradients: at most 2.2e-6 apart on an AMD
    # EPYC Zen 3 (AVX2), under 1e-6 on Zen 4 and Xeon; a lost or doubled micro-batch moves
    # weights by the order of one Adam step (learning rate 5e-3).
    assert all(torch.allclose(one[k], many[k], atol=1e-5) for k in one)


def test_plans_sort_by_length_to_avoid_padding(tiny_model_dir):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(
        tiny_model_dir,
        parent=None,
        config=replace(CONFIG, micro_batch_tokens=400),
    )
    prepared = trainer.prepare(groups(6))
    plan = trainer.plan(prepared)
    lengths = [prepared[i].length for batch in plan for i in batch]
    assert lengths == sorted(lengths, reverse=True)
    assert sorted(i for batch in plan for i in batch) == list(range(6))
    for batch in plan:
        rows = sum(len(prepared[i].group.candidates) for i in batch)
        assert len(batch) == 1 or rows * max(prepared[i].length for i in batch) <= 400


def test_a_non_finite_step_is_refused_and_changes_nothing(tiny_model_dir):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG)
    prepared = trainer.prepare(groups(2))
    reference = [torch.full_like(r, math.nan) for r in trainer.reference(prepared)]

    stats = trainer.step(prepared, reference)

    assert not stats.finite
    after = trainer.lora_state()
    assert all(torch.equal(trainer.initial_state[k], after[k]) for k in after)


def test_save_writes_a_new_read_only_folder_and_never_overwrites(tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG)
    target = trainer.save(tmp_path / "v1")
    names = {p.name for p in target.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not (target / "adapter_model.safetensors").stat().st_mode & 0o222
    with pytest.raises(FileExistsError):
        trainer.save(tmp_path / "v1")
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_preference_accuracy_counts_ties_as_half() -> None:
    data = groups(1)
    assert preference_accuracy([torch.zeros(3)], data) == 0.5
    assert preference_accuracy([torch.tensor([1.0, 0.0, 0.0])], data) == 1.0
    assert preference_accuracy([torch.tensor([-1.0, 0.0, 0.0])], data) == 0.0


def test_the_crisis_set_takes_the_safety_path() -> None:
    check = check_crisis_path()
    assert check["passed"] and not check["missed"]


def test_edges_are_checked_against_the_candidates() -> None:
    for bad in (
        [{"winner": 0, "loser": 3, "weight": 0.5}],
        [{"winner": 1, "loser": 1, "weight": 0.5}],
        [{"winner": 0, "loser": 1, "weight": 0.0}],
        [],
    ):
        with pytest.raises(ValueError):
            to_edges(bad, 3)


def _chat(group: TrainGroup) -> list:  # type: ignore[type-arg]
    from counselor_engine.backends.base import ChatMessage

    return [ChatMessage(m["role"], m["content"]) for m in group.prompt]  # type: ignore[arg-type]


def test_head_only_log_probs_match_a_full_forward(tiny_model_dir, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from counselor_engine import torchkit
    from counselor_engine.backends.tiny import build_tiny_adapter

    parent = build_tiny_adapter(tiny_model_dir, tmp_path / "parent", seed=2)
    trainer = LipoTrainer(tiny_model_dir, parent=parent, config=CONFIG)
    assert torchkit.decoder_and_head(trainer.model) is not None  # peft-wrapped
    prompts = [render_prompt(trainer.tokenizer, _chat(g)) for g in groups(3)]
    replies = ["It makes sense that you feel this way.", "Rating 3 of 5.", "A or B? " * 20]
    for max_length in (64, 24):  # 24: prompts lose their start, replies their end
        head_only = response_logprobs(
            trainer.model, trainer.tokenizer, prompts, replies, max_length=max_length
        )
        with monkeypatch.context() as patch:  # as for a model with soft-capped logits
            patch.setattr(torchkit, "decoder_and_head", lambda model: None)
            full = response_logprobs(
                trainer.model, trainer.tokenizer, prompts, replies, max_length=max_length
            )
        assert torch.allclose(head_only, full, atol=1e-4)
