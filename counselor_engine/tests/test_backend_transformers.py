"""TransformersBackend on the tiny random model: batching, seeding, streaming, judge
probabilities, masked log-probabilities and adapter switching."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest
import torch

from counselor_engine.backends import (
    Backend,
    BackendError,
    ChatMessage,
    GenerationParams,
    StreamDelta,
    StreamDone,
    make_backend,
)
from counselor_engine.backends.transformers_backend import (
    IncrementalDecoder,
    TransformersBackend,
    _ModelGate,
    encode_pairs,
    render_prompt,
    response_logprobs,
)

PARAMS = GenerationParams(max_new_tokens=12, temperature=0.8, top_p=0.95, seed=7)


def other_prompt() -> list[ChatMessage]:
    return [
        ChatMessage("system", "You are a warm, careful counselor."),
        ChatMessage("user", "My brother feels lonely since the move."),
    ]


# -- protocol and factory -------------------------------------------------------------------


def test_it_implements_the_protocol(tiny_backend: TransformersBackend) -> None:
    assert isinstance(tiny_backend, Backend)
    assert tiny_backend.name == "transformers"
    assert not tiny_backend.model.training  # eval mode: no dropout


def test_it_is_built_by_the_factory(tiny_model_path: Path) -> None:
    backend = make_backend("transformers", model_path=tiny_model_path)
    assert isinstance(backend, TransformersBackend)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("llama.cpp")


def test_it_reports_a_missing_model_as_backend_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="cannot load model"):
        TransformersBackend(tmp_path / "nothing-here")


def test_it_never_inserts_a_system_prompt(tiny_backend: TransformersBackend) -> None:
    text = render_prompt(tiny_backend.tokenizer, [ChatMessage("user", "Hi")])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


# -- generate -------------------------------------------------------------------------------


async def test_it_samples_n_candidates_in_one_generate_call(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict] = []
    real = tiny_backend.model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_backend.model, "generate", spy)
    texts = await tiny_backend.generate(chat_prompt, n=5, params=PARAMS)
    assert len(texts) == 5 and all(isinstance(t, str) for t in texts)
    assert len(calls) == 1
    assert calls[0]["num_return_sequences"] == 5
    assert calls[0]["input_ids"].shape[0] == 1  # one prompt, expanded inside generate
    assert len(set(texts)) > 1  # sampled, not copies


async def test_the_shared_prompt_prefill_changes_no_sample(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    tok = tiny_backend.tokenizer
    ids = tok(render_prompt(tok, chat_prompt), add_special_tokens=False, return_tensors="pt")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(PARAMS.seed)
        out = tiny_backend.model.generate(
            **ids,
            num_return_sequences=4,
            do_sample=True,
            temperature=PARAMS.temperature,
            top_p=PARAMS.top_p,
            top_k=0,
            max_new_tokens=PARAMS.max_new_tokens,
            pad_token_id=tok.pad_token_id,
        )
    plain = [tiny_backend._decode_new(row[ids["input_ids"].shape[1] :]) for row in out]
    assert await tiny_backend.generate(chat_prompt, n=4, params=PARAMS) == plain


async def test_it_reproduces_a_seeded_call(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    first = await tiny_backend.generate(chat_prompt, n=3, params=PARAMS)
    torch.rand(5)  # unrelated RNG use in between must not matter
    second = await tiny_backend.generate(chat_prompt, n=3, params=PARAMS)
    other_seed = GenerationParams(max_new_tokens=12, seed=8)
    third = await tiny_backend.generate(chat_prompt, n=3, params=other_seed)
    assert first == second
    assert third != first


async def test_it_leaves_the_global_rng_alone_when_seeded(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    await tiny_backend.generate(chat_prompt, n=2, params=PARAMS)
    assert torch.equal(torch.rand(3), expected)


async def test_it_copies_the_greedy_candidate(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    greedy = GenerationParams(max_new_tokens=8, temperature=0.0)
    texts = await tiny_backend.generate(chat_prompt, n=3, params=greedy)
    assert len(texts) == 3 and len(set(texts)) == 1


async def test_it_rejects_n_below_one(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    with pytest.raises(ValueError):
        await tiny_backend.generate(chat_prompt, n=0, params=PARAMS)


async def test_it_stops_at_eos_and_strips_special_tokens(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tok = tiny_backend.tokenizer
    eos = tok.eos_token_id
    body = tok.encode("It is okay.", add_special_tokens=False)

    def fake_generate(*, input_ids, num_return_sequences, **kwargs):
        rows = input_ids.expand(num_return_sequences, -1)
        tail = torch.tensor([[*body, eos, *tok.encode("junk", add_special_tokens=False)]])
        return torch.cat([rows, tail.expand(num_return_sequences, -1)], dim=1)

    monkeypatch.setattr(tiny_backend.model, "generate", fake_generate)
    texts = await tiny_backend.generate(chat_prompt, n=2, params=PARAMS)
    assert texts == ["It is okay.", "It is okay."]


# -- streaming ------------------------------------------------------------------------------


async def test_it_streams_candidate_zero_then_all_texts(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    events = [e async for e in tiny_backend.generate_stream(chat_prompt, n=3, params=PARAMS)]
    deltas = [e for e in events[:-1] if isinstance(e, StreamDelta)]
    done = events[-1]
    assert isinstance(done, StreamDone) and len(done.texts) == 3
    assert len(deltas) >= 2 and all(d.index == 0 for d in deltas)
    assert "".join(d.text for d in deltas) == done.texts[0]
    # Same seed, same texts as the non-streaming call.
    assert done.texts == await tiny_backend.generate(chat_prompt, n=3, params=PARAMS)


async def test_it_ends_generation_when_the_stream_consumer_leaves(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    long = GenerationParams(max_new_tokens=400, seed=1)
    stream = tiny_backend.generate_stream(chat_prompt, n=2, params=long)
    async with contextlib.aclosing(stream):
        async for event in stream:
            assert isinstance(event, StreamDelta)
            break
    # The model is free again (the gate was released): a new call completes.
    texts = await asyncio.wait_for(
        tiny_backend.generate(chat_prompt, n=1, params=PARAMS), timeout=120
    )
    assert len(texts) == 1


async def test_it_raises_stream_errors_in_the_consumer(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(**kwargs):
        raise RuntimeError("device on fire")

    monkeypatch.setattr(tiny_backend.model, "generate", broken)
    with pytest.raises(BackendError, match="device on fire"):
        async for _ in tiny_backend.generate_stream(chat_prompt, n=2, params=PARAMS):
            pass


def test_incremental_decoder_holds_back_split_characters(tiny_backend: TransformersBackend) -> None:
    tok = tiny_backend.tokenizer
    text = "café ok 😀 done"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    decoder = IncrementalDecoder(tok)
    deltas = [decoder.push(i) for i in ids]
    deltas.append(decoder.finish())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


# -- choice probabilities -------------------------------------------------------------------


async def test_choice_probabilities_sum_to_one_and_follow_the_prompt(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    ab = await tiny_backend.choice_probabilities([chat_prompt, other_prompt()], ["A", "B"])
    likert = await tiny_backend.choice_probabilities([chat_prompt], list("12345"))
    for row in [*ab, *likert]:
        assert sum(row) == pytest.approx(1.0, abs=1e-6)
        assert all(0.0 <= p <= 1.0 for p in row)
    assert len(likert[0]) == 5
    assert ab[0] != pytest.approx(ab[1], abs=1e-6)


async def test_choice_probabilities_do_not_depend_on_the_batch(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    longer = [*chat_prompt, ChatMessage("assistant", "Tell me more."), ChatMessage("user", "Ok.")]
    batched = await tiny_backend.choice_probabilities([chat_prompt, longer], ["A", "B"])
    alone = await tiny_backend.choice_probabilities([chat_prompt], ["A", "B"])
    assert batched[0] == pytest.approx(alone[0], abs=1e-5)  # left padding is invisible


async def test_choice_probabilities_match_the_next_token_softmax(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    tok = tiny_backend.tokenizer
    ids = tok(render_prompt(tok, chat_prompt), add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(tiny_backend.model(**ids).logits[0, -1], dim=-1)
    a, b = tok.convert_tokens_to_ids("A"), tok.convert_tokens_to_ids("B")
    expected = [float(probs[a] / (probs[a] + probs[b])), float(probs[b] / (probs[a] + probs[b]))]
    got = await tiny_backend.choice_probabilities([chat_prompt], ["A", "B"])
    assert got[0] == pytest.approx(expected, abs=1e-5)


async def test_choice_probabilities_reject_multi_token_choices(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    with pytest.raises(ValueError, match="single token"):
        await tiny_backend.choice_probabilities([chat_prompt], ["A", "something else"])
    with pytest.raises(ValueError):
        await tiny_backend.choice_probabilities([chat_prompt], [])
    assert await tiny_backend.choice_probabilities([], ["A", "B"]) == []


# -- sequence log-probabilities -------------------------------------------------------------


async def test_sequence_logprobs_sum_response_tokens_only(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    tok, model = tiny_backend.tokenizer, tiny_backend.model
    response = "That sounds really hard."
    p_ids = tok(render_prompt(tok, chat_prompt), add_special_tokens=False)["input_ids"]
    r_ids = [*tok(response, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    ids = torch.tensor([p_ids + r_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    by_hand = sum(float(logp[len(p_ids) + j - 1, t]) for j, t in enumerate(r_ids))
    with_prompt = by_hand + sum(float(logp[i - 1, p_ids[i]]) for i in range(1, len(p_ids)))

    got = await tiny_backend.sequence_logprobs([chat_prompt], [response])
    assert got[0] == pytest.approx(by_hand, abs=1e-3)
    assert got[0] != pytest.approx(with_prompt, abs=1e-1)  # the prompt is masked out


async def test_sequence_logprobs_do_not_depend_on_padding(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    short, long = "Okay.", "It is okay to take small steps, and we can go slowly together."
    both = await tiny_backend.sequence_logprobs([chat_prompt, other_prompt()], [short, long])
    alone = await tiny_backend.sequence_logprobs([chat_prompt], [short])
    assert both[0] == pytest.approx(alone[0], abs=1e-4)
    assert both[1] < both[0] < 0  # more tokens, more (negative) log-probability


def test_encode_pairs_masks_prompt_and_padding(tiny_backend: TransformersBackend) -> None:
    tok = tiny_backend.tokenizer
    ids, attention, mask = encode_pairs(tok, ["ab", "abcdef"], ["x", "yz"], max_length=64)
    for row in range(2):
        n_resp = int(mask[row].sum())
        n_real = int(attention[row].sum())
        resp_ids = tok(["x", "yz"][row], add_special_tokens=False)["input_ids"]
        assert n_resp == len(resp_ids) + 1  # + EOS
        assert mask[row, n_real - n_resp : n_real].all() and not mask[row, n_real:].any()
        assert int(ids[row, n_real - 1]) == tok.eos_token_id
    # Too long: the prompt loses its start, the response is kept whole.
    ids, attention, mask = encode_pairs(tok, ["a b c d e f g h"], ["x"], max_length=4)
    assert ids.shape[1] == 4 and int(mask.sum()) == 2


def test_response_logprobs_is_differentiable_with_a_peft_model(
    tiny_backend: TransformersBackend, tiny_adapter_paths: dict[str, Path]
) -> None:
    from peft import PeftModel

    tok = tiny_backend.tokenizer
    prompts = [render_prompt(tok, [ChatMessage("system", "S"), ChatMessage("user", "Hi")])] * 2
    responses = ["It is okay.", "Tell me more."]
    base_value = response_logprobs(tiny_backend.model, tok, prompts, responses, max_length=128)

    model = PeftModel.from_pretrained(
        tiny_backend.model, str(tiny_adapter_paths["v1"]), is_trainable=True
    )
    policy = response_logprobs(model, tok, prompts, responses, max_length=128)
    with torch.no_grad(), model.disable_adapter():
        reference = response_logprobs(model, tok, prompts, responses, max_length=128)
    assert policy.shape == (2,) and policy.requires_grad
    assert torch.allclose(reference, base_value.detach(), atol=1e-5)
    assert not torch.allclose(policy.detach(), reference, atol=1e-3)
    policy.sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all("lora_" in n for n in grads)
    assert any(g is not None and g.abs().sum() > 0 for g in grads.values())


# -- adapters -------------------------------------------------------------------------------


async def _snapshot(backend: TransformersBackend, prompt, adapter: str | None):
    return (
        await backend.generate(prompt, n=2, params=PARAMS, adapter=adapter),
        await backend.choice_probabilities([prompt], ["A", "B"], adapter=adapter),
        await backend.sequence_logprobs([prompt], ["It is okay."], adapter=adapter),
    )


async def test_adapters_switch_per_call_and_base_results_are_restored_exactly(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    chat_prompt: list[ChatMessage],
) -> None:
    base = await _snapshot(tiny_backend, chat_prompt, None)
    await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    await tiny_backend.load_adapter("v2", str(tiny_adapter_paths["v2"]))
    v1 = await _snapshot(tiny_backend, chat_prompt, "v1")
    v2 = await _snapshot(tiny_backend, chat_prompt, "v2")
    assert v1[1] != base[1] and v1[2] != base[2] and v1[0] != base[0]
    assert v2[1] != v1[1] and v2[2] != v1[2]
    assert await _snapshot(tiny_backend, chat_prompt, None) == base
    assert await _snapshot(tiny_backend, chat_prompt, "v1") == v1
    assert not tiny_backend.model.training


async def test_loading_an_adapter_twice_is_idempotent(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    chat_prompt: list[ChatMessage],
) -> None:
    path = str(tiny_adapter_paths["v1"])
    await tiny_backend.load_adapter("v1", path)
    first = await _snapshot(tiny_backend, chat_prompt, "v1")
    model = tiny_backend.model
    await tiny_backend.load_adapter("v1", path)
    assert tiny_backend.model is model
    assert tiny_backend.adapters == {"v1": path}
    assert await _snapshot(tiny_backend, chat_prompt, "v1") == first


async def test_unknown_adapters_are_backend_errors(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    chat_prompt: list[ChatMessage],
    tmp_path: Path,
) -> None:
    with pytest.raises(BackendError, match="unknown adapter"):
        await tiny_backend.generate(chat_prompt, n=1, params=PARAMS, adapter="v9")
    with pytest.raises(BackendError):
        await tiny_backend.choice_probabilities([chat_prompt], ["A", "B"], adapter="v9")
    with pytest.raises(BackendError):
        await tiny_backend.sequence_logprobs([chat_prompt], ["x"], adapter="v9")
    with pytest.raises(BackendError):
        async for _ in tiny_backend.generate_stream(chat_prompt, n=1, params=PARAMS, adapter="v9"):
            pass
    with pytest.raises(BackendError, match="adapter_config"):
        await tiny_backend.load_adapter("bad", str(tmp_path))
    await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    with pytest.raises(BackendError, match="unknown adapter"):
        await tiny_backend.generate(chat_prompt, n=1, params=PARAMS, adapter="v2")


async def test_unloading_adapters_restores_the_plain_base_model(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    chat_prompt: list[ChatMessage],
) -> None:
    base = await _snapshot(tiny_backend, chat_prompt, None)
    await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    await tiny_backend.load_adapter("v2", str(tiny_adapter_paths["v2"]))
    v2 = await _snapshot(tiny_backend, chat_prompt, "v2")
    await tiny_backend.unload_adapter("v1")
    await tiny_backend.unload_adapter("v1")  # idempotent
    assert await _snapshot(tiny_backend, chat_prompt, "v2") == v2
    with pytest.raises(BackendError):
        await tiny_backend.generate(chat_prompt, n=1, params=PARAMS, adapter="v1")
    await tiny_backend.unload_adapter("v2")
    assert tiny_backend.adapters == {}
    assert await _snapshot(tiny_backend, chat_prompt, None) == base
    # And it can be loaded again after the peft wrapper is gone.
    await tiny_backend.load_adapter("v2", str(tiny_adapter_paths["v2"]))
    assert await _snapshot(tiny_backend, chat_prompt, "v2") == v2


async def test_concurrent_calls_on_different_adapters_get_their_own_results(
    tiny_model_path: Path, tiny_adapter_paths: dict[str, Path], chat_prompt: list[ChatMessage]
) -> None:
    backend = TransformersBackend(tiny_model_path, max_concurrency=2)
    await backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    alone = {a: await _snapshot(backend, chat_prompt, a) for a in (None, "v1")}
    together = await asyncio.gather(
        *(_snapshot(backend, chat_prompt, a) for a in (None, "v1", None, "v1"))
    )
    assert together == [alone[None], alone["v1"], alone[None], alone["v1"]]


def test_the_gate_never_mixes_adapters() -> None:
    gate = _ModelGate(limit=3)
    inside: list[str] = []
    seen_mixed: list[list[str]] = []
    lock = threading.Lock()

    def worker(key: str) -> None:
        for _ in range(50):
            with gate.hold(key):
                with lock:
                    inside.append(key)
                    if len(set(inside)) > 1:
                        seen_mixed.append(list(inside))
                with lock:
                    inside.remove(key)

    threads = [threading.Thread(target=worker, args=(k,)) for k in "abab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen_mixed == []
