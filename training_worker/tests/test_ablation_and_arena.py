"""The pairwise-DPO loss option (Table 3 ablation) and the arena validation check."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from counselor_engine.lipo.config import LipoConfig
from training_worker.arena import ArenaSpec, arena_check, compare, profiles
from training_worker.round import round_config
from training_worker.tests.test_trainer import CONFIG, groups
from training_worker.trainer import LipoTrainer, TrainGroup, to_edges


def test_an_unknown_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="loss"):
        LipoConfig(loss="kto")


def test_the_round_takes_its_loss_from_the_run(settings) -> None:  # type: ignore[no-untyped-def]
    assert round_config("pairwise_dpo").loss == "pairwise_dpo"
    assert round_config(None).loss == "lipo"


def _uneven_groups() -> list[TrainGroup]:
    """Two groups of the test prompts: one with both edges, one with a single edge."""
    two, one = groups(2)
    edges = to_edges([{"winner": 2, "loser": 1, "weight": 0.2}], 3)
    return [two, TrainGroup(one.key, one.modality, one.prompt, one.candidates, edges)]


def test_pairwise_dpo_trains_every_edge_as_a_unit_pair(tiny_model_dir):  # type: ignore[no-untyped-def]
    """Step 0 (h = 0): every pair's term is log 2 whatever its SOCA weight, so DPO's loss is
    log 2 where LiPO's is mean_g sum_e w_e log 2 / |E_g|. After one step, the DPO loss is
    exactly the mean of softplus(-(h_w - h_l)) over all three pairs of the batch (the two
    of the first group count twice as much as the second group's one: no per-group
    normalisation), not the mean of the group means."""
    config = replace(CONFIG, loss="pairwise_dpo")
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=config)
    prepared = trainer.prepare(_uneven_groups())
    reference = trainer.reference(prepared)
    first = trainer.step(prepared, reference)
    assert first.loss == pytest.approx(math.log(2), rel=1e-5)
    lipo = ((0.6 + 0.5) / 2 + 0.2) / 2 * math.log(2)
    assert first.loss != pytest.approx(lipo, rel=1e-3)

    h0, h1 = trainer.utilities(prepared, reference)
    terms = [
        F.softplus(-(h0[0] - h0[1])),
        F.softplus(-(h0[0] - h0[2])),
        F.softplus(-(h1[2] - h1[1])),
    ]
    per_pair = torch.stack(terms).mean()
    per_group = ((terms[0] + terms[1]) / 2 + terms[2]) / 2
    second = trainer.step(prepared, reference)
    assert second.loss == pytest.approx(float(per_pair), rel=1e-4)
    assert float(per_pair) != pytest.approx(float(per_group), rel=1e-3)


def test_the_dpo_gradient_does_not_depend_on_how_groups_are_split(tiny_model_dir):  # type: ignore[no-untyped-def]
    """Micro-batching (a token budget of one group per forward pass) gives the same loss as
    one pass over the whole batch: each pair keeps weight 1 / (all pairs)."""
    losses = []
    for tokens in (64, 100_000):
        config = replace(CONFIG, loss="pairwise_dpo", micro_batch_tokens=tokens)
        trainer = LipoTrainer(tiny_model_dir, parent=None, config=config)
        prepared = trainer.prepare(_uneven_groups())
        reference = trainer.reference(prepared)
        trainer.step(prepared, reference)
        losses.append((len(trainer.plan(prepared)), trainer.step(prepared, reference).loss))
    (split, a), (whole, b) = losses
    assert split == 2 and whole == 1
    assert a == pytest.approx(b, rel=1e-5)


# -- arena ------------------------------------------------------------------------------


def test_the_arena_rule() -> None:
    active = {"c_shared": 5.0, "c_spec": 5.0, "l_shared": 5.0, "l_spec": None, "overall": 5.0}
    same = dict(active)
    assert compare(active, same, 0.5) == (True, ["c_shared", "c_spec", "l_shared", "overall"], [])
    slightly = {**active, "c_spec": 4.6}
    assert compare(active, slightly, 0.5)[0] is True
    worse = {**active, "l_shared": 4.4}
    assert compare(active, worse, 0.5) == (
        False, ["c_shared", "c_spec", "l_shared", "overall"], ["l_shared"]
    )  # fmt: skip
    nothing = dict.fromkeys(active)
    assert compare(active, nothing, 0.5) == (False, [], [])
    with pytest.raises(ValueError):
        LipoConfig(arena_tolerance=-1)


def test_the_arena_uses_a_fixed_spread_of_profiles() -> None:
    chosen = profiles(5)
    assert len({p.modality for p in chosen}) == 5
    assert [p.id for p in profiles(5)] == [p.id for p in chosen]


def test_a_disabled_arena_is_recorded_as_skipped() -> None:
    check = arena_check(None, LipoConfig())
    assert check["skipped"] and check["passed"]
    assert arena_check(object(), LipoConfig(arena_clients=0))["skipped"]  # type: ignore[arg-type]


def test_the_arena_plays_both_versions_on_simulated_clients(tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG)
    prepared = trainer.prepare(groups(2))
    trainer.step(prepared, trainer.reference(prepared))
    candidate = trainer.save(tmp_path / "v2")
    spec = ArenaSpec(tiny_model_dir, None, None, candidate, "v2")
    config = LipoConfig(
        arena_clients=1, arena_sessions=1, arena_turns=2, arena_candidates=2, side_by_side_tokens=8
    )

    check = arena_check(spec, config)

    assert check["name"] == "arena" and not check.get("skipped")
    assert check["active_version"] == "base model" and check["candidate_version"] == "v2"
    for side in ("active", "candidate"):
        assert set(check[side]) == {"c_shared", "c_spec", "l_shared", "l_spec", "overall"}
        assert check[side]["overall"] is not None and 0 <= check[side]["overall"] <= 10
    assert check["passed"] == compare(check["active"], check["candidate"], 0.5)[0]
