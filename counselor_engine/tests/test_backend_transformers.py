"""TransformersBackend on the tiny random model: batching, seeding, streaming, judge
probabilities, masked log-probabilities and adapter switching."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, StaticCache

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
    _cancel_event,
    _ModelGate,
)
from counselor_engine.torchkit import (
    PrefixNode,
    encode_pairs,
    prefix_tree,
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


def _spy_generate(backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Records the keyword arguments of every ``model.generate`` call."""
    calls: list[dict] = []
    real = backend.model.generate

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(backend.model, "generate", spy)
    return calls


async def test_it_samples_n_candidates_in_one_generate_call(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _spy_generate(tiny_backend, monkeypatch)
    texts = await tiny_backend.generate(chat_prompt, n=5, params=PARAMS)
    assert len(texts) == 5 and all(isinstance(t, str) for t in texts)
    assert len(calls) == 1
    assert calls[0]["num_return_sequences"] == 5
    assert calls[0]["input_ids"].shape[0] == 1  # one prompt, expanded inside generate
    assert len(set(texts)) > 1  # sampled, not copies
    # The prompt prefilled once into a preallocated cache that holds every new token.
    cache = calls[0]["cache"]
    assert isinstance(cache, StaticCache)
    width = calls[0]["input_ids"].shape[1] + PARAMS.max_new_tokens
    assert all(layer.keys.shape[0] == 5 and layer.max_cache_len == width for layer in cache.layers)


async def test_models_with_other_cache_layers_generate_on_a_dynamic_cache(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    static = await tiny_backend.generate(chat_prompt, n=4, params=PARAMS)
    monkeypatch.setattr(tiny_backend, "_prefix_sharing", False)  # e.g. sliding windows
    calls = _spy_generate(tiny_backend, monkeypatch)
    assert await tiny_backend.generate(chat_prompt, n=4, params=PARAMS) == static
    assert type(calls[0]["cache"]) is DynamicCache


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


# -- cancellation -----------------------------------------------------------------------------


class _ForwardSpy:
    """Counts the decoder's forward passes; ``late`` counts those made after the caller saw
    the cancellation return. At forward ``stop_after`` it sets ``reached`` and holds the
    worker thread until its call is cancelled, so the test knows where the call stood."""

    def __init__(self, backend: TransformersBackend, stop_after: int = 10**9) -> None:
        self.count = 0
        self.late = 0
        self.stop_after = stop_after
        self.reached = threading.Event()
        self.returned = False
        self._handle = backend.model.get_decoder().register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:  # type: ignore[no-untyped-def]
        self.count += 1
        self.late += self.returned
        if self.count == self.stop_after:
            self.reached.set()
            cancel = _cancel_event()
            assert cancel is not None and cancel.wait(120)

    def remove(self) -> None:
        self._handle.remove()

    async def cancel_when_reached(self, task: asyncio.Task) -> None:  # type: ignore[type-arg]
        assert await asyncio.to_thread(self.reached.wait, 120), "the call never got that far"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        self.returned = True
        await asyncio.sleep(0.5)  # a thread still running would go on calling the model here
        self.remove()


async def test_a_cancelled_generate_stops_at_its_next_step(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    """A reply superseded by a crisis (or past the backend timeout) must not keep the cores
    busy: the worker thread stops at the next decoding step, before the cancellation
    returns, and the model is free for the next call."""
    long = GenerationParams(max_new_tokens=200, temperature=0.8, top_p=0.95, seed=3)
    full = _ForwardSpy(tiny_backend)
    await tiny_backend.generate(chat_prompt, n=2, params=long)
    full.remove()
    assert full.count > 40  # long enough to tell a stopped call from a finished one
    spy = _ForwardSpy(tiny_backend, stop_after=3)
    await spy.cancel_when_reached(
        asyncio.ensure_future(tiny_backend.generate(chat_prompt, n=2, params=long))
    )
    assert spy.count == 3  # it stopped right after the step it was in
    assert spy.late == 0, "the model was still called after the cancellation returned"
    assert len(await tiny_backend.generate(chat_prompt, n=1, params=PARAMS)) == 1


@pytest.mark.parametrize("call", ["sequence_logprobs", "choice_probabilities"])
async def test_a_cancelled_scoring_call_stops_before_its_next_batch(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The judge's scoring calls stop between batches: cancelled in its first forward, a
    call that needs many forwards makes no other."""
    monkeypatch.setattr("counselor_engine.backends.transformers_backend._LEAF_ROWS", 1)
    prompts, responses = contrast_like_batch()
    other = responses if call == "sequence_logprobs" else ["A", "B"]
    method = getattr(tiny_backend, call)
    full = _ForwardSpy(tiny_backend)
    await method(prompts, other)
    full.remove()
    assert full.count > 8
    spy = _ForwardSpy(tiny_backend, stop_after=1)
    await spy.cancel_when_reached(asyncio.ensure_future(method(prompts, other)))
    assert spy.count == 1
    assert spy.late == 0, "the model was still called after the cancellation returned"


async def test_a_call_cancelled_while_waiting_for_the_model_never_runs(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    """Cancelled while another call holds the model: it leaves without a forward pass."""
    spy = _ForwardSpy(tiny_backend)
    with tiny_backend._gate.hold(None, exclusive=True):
        task = asyncio.ensure_future(tiny_backend.generate(chat_prompt, n=1, params=PARAMS))
        await asyncio.sleep(0.2)  # the call's thread now waits at the gate
        task.cancel()
        await asyncio.sleep(0.2)
    with pytest.raises(asyncio.CancelledError):
        await task
    spy.remove()
    assert spy.count == 0


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


# -- choice probabilities: shared prefixes ---------------------------------------------------

_SYSTEM = ChatMessage("system", "You compare two counselor replies for a client and pick one.")
_CONVO = (
    "Client: I feel anxious about work.\nCounselor: That sounds really hard.\n"
    "Client: My boss criticises everything I do and I cannot sleep."
)
_REPLIES = (
    "It makes sense that you feel this way.",
    "What helps you, even a little, when this happens? Let us take a moment together.",
    "Thank you for trusting me with this. It is okay to take small steps.",
)
_CRITERIA = (
    "Which reply is warmer?",
    "Which reply responds more directly to what the client said in their last message?",
    "Which reply asks more?",
    "Which reply is clearer and easier for the client to follow?",
)


def _pair_prompt(a: int, b: int, criterion: str) -> list[ChatMessage]:
    body = (
        f"{_CONVO}\n<reply_A>\n{_REPLIES[a]}\n</reply_A>\n<reply_B>\n{_REPLIES[b]}\n</reply_B>"
        f"\n\nCriterion: {criterion}\nAnswer A or B."
    )
    return [_SYSTEM, ChatMessage("user", body)]


def judge_like_batch(chat_prompt: list[ChatMessage]) -> list[list[ChatMessage]]:
    """Groups of prompts that share everything but the last line (like the judge's, with
    replies of different lengths), interleaved with unrelated prompts."""
    grouped = [_pair_prompt(a, b, c) for a, b in ((0, 1), (1, 0), (1, 2)) for c in _CRITERIA]
    unrelated = [
        chat_prompt,
        other_prompt(),
        [ChatMessage("system", "Rate the reply."), ChatMessage("user", "Ok.")],
    ]
    batch = list(grouped)
    for k, prompt in enumerate(unrelated):
        batch.insert(4 * k + 1, prompt)
    return batch


def _token_rows(backend: TransformersBackend, prompts) -> list[list[int]]:  # type: ignore[no-untyped-def]
    tok = backend.tokenizer
    return [tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]


def _plain(backend: TransformersBackend, prompts, adapter: str | None = None):  # type: ignore[no-untyped-def]
    """The reference: every prompt in full, in one left-padded forward."""
    ids = backend._choice_token_ids(["A", "B"])
    return backend._choice_blocking(list(prompts), ids, adapter, share_prefixes=False)


def _record_segments(
    backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, list[int]]]:
    """Records every forward of the shared and plain paths: (longest context, segment lengths)."""
    calls: list[tuple[int, list[int]]] = []
    real = backend._segment_inputs

    def spy(segments, cache, past_mask, past_length):  # type: ignore[no-untyped-def]
        past = past_length if isinstance(past_length, int) else int(past_length.max())
        calls.append((past, [len(s) for s in segments]))
        return real(segments, cache, past_mask, past_length)

    monkeypatch.setattr(backend, "_segment_inputs", spy)
    return calls


def _shape(item: int | PrefixNode):  # type: ignore[no-untyped-def]
    """A node as the (frozen) set of its children's shapes, a prompt as its index."""
    return item if isinstance(item, int) else frozenset(_shape(c) for c in item.children)


def _leaves(item: int | PrefixNode) -> list[int]:
    if isinstance(item, int):
        return [item]
    return sorted(i for child in item.children for i in _leaves(child))


def _assert_close(got: list[list[float]], expected: list[list[float]]) -> None:
    assert len(got) == len(expected)
    for row, ref in zip(got, expected, strict=True):
        assert row == pytest.approx(ref, abs=1e-5)


def test_judge_like_prompts_nest_their_shared_prefixes(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    batch = judge_like_batch(chat_prompt)
    rows = _token_rows(tiny_backend, batch)
    decode = tiny_backend.tokenizer.decode
    pair = [i for i, p in enumerate(batch) if p[0] is _SYSTEM]
    b0, b1, b2 = (frozenset(pair[k : k + len(_CRITERIA)]) for k in range(0, 12, len(_CRITERIA)))
    tree = prefix_tree(rows)
    # The unrelated prompts stay alone; the pair prompts share system prompt and
    # conversation; under that, block (0, 1) and reply A = reply 1, which blocks (1, 0)
    # and (1, 2) share; under each block, its criteria as leaves.
    unrelated = [i for i in range(len(batch)) if i not in pair]
    assert sorted(item for item in tree if isinstance(item, int)) == unrelated
    (conversation,) = [item for item in tree if isinstance(item, PrefixNode)]
    assert _shape(conversation) == {b0, frozenset({b1, b2})}
    assert decode(conversation.tokens).endswith("<reply_A>\n")
    (reply_1,) = [c for c in conversation.children if _leaves(c) == sorted(b1 | b2)]
    assert isinstance(reply_1, PrefixNode)
    assert decode(reply_1.tokens).endswith(_REPLIES[1] + "\n</reply_A>\n<reply_B>\n")
    for block in reply_1.children:
        assert isinstance(block, PrefixNode)
        text = decode(block.tokens)
        assert "</reply_B>" in text and not any(c in text for c in _CRITERIA)
        assert len({tuple(rows[i][: len(block.tokens) + 1]) for i in _leaves(block)}) > 1


async def test_shared_prefixes_give_the_plain_forward_probabilities_in_input_order(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = judge_like_batch(chat_prompt)
    expected = _plain(tiny_backend, batch)
    forwards = _record_segments(tiny_backend, monkeypatch)
    got = await tiny_backend.choice_probabilities(batch, ["A", "B"])
    # The shared path ran, nested, and computed far fewer tokens than the prompts hold.
    assert len(forwards) > 3 and max(past for past, _ in forwards) >= 32
    computed = sum(sum(lengths) for _, lengths in forwards)
    assert computed < 0.5 * sum(map(len, _token_rows(tiny_backend, batch)))
    _assert_close(got, expected)
    assert len({round(row[0], 4) for row in got}) > len(batch) // 2  # rows really differ
    # Input order: a reversed batch gives the reversed rows; each row matches its prompt
    # scored alone.
    _assert_close(await tiny_backend.choice_probabilities(batch[::-1], ["A", "B"]), got[::-1])
    for k in (0, 1, 5, len(batch) - 1):
        _assert_close(_plain(tiny_backend, [batch[k]]), [got[k]])


def _judged_group():  # type: ignore[no-untyped-def]
    """A mid-session context and four candidates, for whole judge passes on both paths."""
    from counselor_engine.judge import JudgeContext

    context = JudgeContext(
        (("client", "I feel anxious about work."), ("counselor", _REPLIES[0])),
        "My boss criticises everything I do and I cannot sleep.",
        "Reflection",
    )
    return context, [*_REPLIES, "It is okay."]


async def test_a_judge_pass_is_the_same_on_both_paths(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from counselor_engine.judge import Judge

    context, candidates = _judged_group()
    shared = await Judge(tiny_backend).judge_group(context, candidates)
    plain_blocking = functools.partial(
        TransformersBackend._choice_blocking, tiny_backend, share_prefixes=False
    )
    monkeypatch.setattr(tiny_backend, "_choice_blocking", plain_blocking)
    plain = await Judge(tiny_backend).judge_group(context, candidates)
    assert len(shared.judgments) == 6 * 2 * 12  # 6 pairs, 2 orders, 12 criteria
    assert [j.p_a for j in shared.judgments] == pytest.approx(
        [j.p_a for j in plain.judgments], abs=1e-5
    )
    assert shared.pointwise == pytest.approx(plain.pointwise, abs=1e-4)
    for pair, values in plain.support.items():
        assert shared.support[pair] == pytest.approx(values, abs=1e-5)


async def test_a_contrastive_judge_pass_is_the_same_on_both_paths(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23's bar: the same readings within 1e-4, so the same edges and delivery."""
    from counselor_engine.judge import Judge

    context, candidates = _judged_group()
    shared = await Judge(tiny_backend, evaluator="contrastive").judge_group(context, candidates)
    plain_blocking = functools.partial(
        TransformersBackend._logprobs_blocking, tiny_backend, share_prefixes=False
    )
    monkeypatch.setattr(tiny_backend, "_logprobs_blocking", plain_blocking)
    plain = await Judge(tiny_backend, evaluator="contrastive").judge_group(context, candidates)
    assert len(shared.judgments) == 6 * 2 * 12
    assert [j.p_a for j in shared.judgments] == pytest.approx(
        [j.p_a for j in plain.judgments], abs=1e-4
    )
    assert shared.support == plain.support


async def test_shared_prefixes_work_for_any_choice_set(
    tiny_backend: TransformersBackend, chat_prompt: list[ChatMessage]
) -> None:
    batch = judge_like_batch(chat_prompt)
    ids = tiny_backend._choice_token_ids(list("12345"))
    expected = tiny_backend._choice_blocking(list(batch), ids, None, share_prefixes=False)
    got = await tiny_backend.choice_probabilities(batch, list("12345"))
    _assert_close(got, expected)
    assert all(len(row) == 5 and sum(row) == pytest.approx(1.0, abs=1e-6) for row in got)


async def test_a_single_prompt_takes_the_plain_path(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = _pair_prompt(0, 1, _CRITERIA[0])
    expected = _plain(tiny_backend, [prompt])
    forwards = _record_segments(tiny_backend, monkeypatch)
    _assert_close(await tiny_backend.choice_probabilities([prompt], ["A", "B"]), expected)
    assert forwards == [(0, [len(_token_rows(tiny_backend, [prompt])[0])])]


async def test_a_prompt_that_is_a_prefix_of_another_keeps_its_own_last_token(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = _pair_prompt(0, 1, _CRITERIA[0])
    longer = [*short, ChatMessage("assistant", "A"), ChatMessage("user", "Why? Answer A or B.")]
    batch = [longer, short, short, longer]  # duplicates too
    rows = _token_rows(tiny_backend, batch)
    assert rows[0][: len(rows[1])] == rows[1]  # really a token prefix
    expected = _plain(tiny_backend, batch)
    forwards = _record_segments(tiny_backend, monkeypatch)
    got = await tiny_backend.choice_probabilities(batch, ["A", "B"])
    # The whole short prompt but its last token is shared: that token is read alone.
    shared = len(rows[1]) - 1
    rest = len(rows[0]) - shared
    assert [(past, sorted(lengths)) for past, lengths in forwards] == [
        (0, [shared]),
        (shared, [rest, rest]),
        (shared, [1, 1]),
    ]
    _assert_close(got, expected)
    # Duplicates agree, to float32 rounding: a row's sums may be ordered differently by its
    # place in the batch (5e-7 apart on an AMD EPYC Zen 3, bit-equal on Zen 4 and Xeon).
    assert got[1] == pytest.approx(got[2], abs=1e-6) and got[0] == pytest.approx(got[3], abs=1e-6)
    assert got[0] != pytest.approx(got[1], abs=1e-3)


async def test_prompts_without_a_long_common_prefix_are_read_whole(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = [
        chat_prompt,
        other_prompt(),
        [ChatMessage("system", "Rate the reply."), ChatMessage("user", "Ok.")],
        [ChatMessage("user", "Which option fits better, A or B?")],
    ]
    rows = _token_rows(tiny_backend, batch)
    assert sorted(prefix_tree(rows)) == [0, 1, 2, 3]  # type: ignore[type-var]
    expected = _plain(tiny_backend, batch)
    forwards = _record_segments(tiny_backend, monkeypatch)
    _assert_close(await tiny_backend.choice_probabilities(batch, ["A", "B"]), expected)
    # Each whole prompt read once, on no shared context.
    assert all(past == 0 for past, _ in forwards)
    assert sorted(n for _, lengths in forwards for n in lengths) == sorted(map(len, rows))


async def test_shared_prefixes_match_the_plain_forward_with_an_adapter(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = judge_like_batch(chat_prompt)
    await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    base = await tiny_backend.choice_probabilities(batch, ["A", "B"])
    expected = _plain(tiny_backend, batch, "v1")
    forwards = _record_segments(tiny_backend, monkeypatch)
    got = await tiny_backend.choice_probabilities(batch, ["A", "B"], adapter="v1")
    assert len(forwards) > 3
    _assert_close(got, expected)
    assert got[0] != pytest.approx(base[0], abs=1e-4)  # the adapter really acts
    _assert_close(await tiny_backend.choice_probabilities(batch, ["A", "B"]), base)
    _assert_close(base, _plain(tiny_backend, batch))


def _tree(rows: list[list[int]], **kwargs: int):  # type: ignore[no-untyped-def]
    """The tree as nested ``(prefix length, children)`` tuples, children in order."""

    def describe(item: int | PrefixNode):  # type: ignore[no-untyped-def]
        if isinstance(item, int):
            return item
        return (len(item.tokens), [describe(c) for c in item.children])

    return [describe(item) for item in prefix_tree(rows, **kwargs)]


def test_prefix_tree_edge_cases() -> None:
    long = list(range(100, 140))  # 40 tokens
    assert _tree([]) == []
    assert _tree([long]) == [0]
    # Duplicates: all but the last token is shared.
    assert _tree([long, long]) == [(39, [0, 1])]
    # A node must save 32 token computations: (children - 1) x its own tokens.
    assert _tree([[*long[:31], 1], [*long[:31], 2]]) == [0, 1]
    assert _tree([[*long[:32], 1], [*long[:32], 2]]) == [(32, [0, 1])]
    assert _tree([[*long[:16], k] for k in range(3)]) == [(16, [0, 1, 2])]
    assert _tree([[*long[:32], 1], [*long[:32], 2]], min_saving=33) == [0, 1]
    # A row that is a prefix of others keeps its last token; a short common part is
    # not worth a node of its own.
    assert _tree([[*long, 7, 8], long[:20], [*long, 9], long]) == [1, (39, [3, 0, 2])]
    # Nested: two clusters sharing 40 tokens, each then sharing 40 more.
    a = [[*long, *range(40), k] for k in range(3)]
    b = [[*long, *range(50, 90), k] for k in range(3)]
    assert _tree([a[0], b[0], a[1], b[1], a[2], b[2]]) == [(40, [(80, [0, 2, 4]), (80, [1, 3, 5])])]
    # A chain of prefixes, each nested in the one before, down to max_depth levels
    # (counting the one-token steps that leave each row its last token).
    chain = [list(range(40 + 40 * k)) for k in range(6)]
    assert _tree(chain) == [(39, [0, (79, [1, (119, [2, (159, [3, (199, [4, 5])])])])])]
    assert _tree(chain, max_depth=3) == [(39, [0, (79, [1, 2, 3, 4, 5])])]


async def test_models_with_other_cache_layers_take_the_plain_path(
    tiny_backend: TransformersBackend,
    chat_prompt: list[ChatMessage],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert tiny_backend._prefix_sharing  # a Llama: plain full-attention KV layers
    batch = judge_like_batch(chat_prompt)
    shared = await tiny_backend.choice_probabilities(batch, ["A", "B"])
    monkeypatch.setattr(tiny_backend, "_prefix_sharing", False)  # e.g. sliding windows
    forwards = _record_segments(tiny_backend, monkeypatch)
    _assert_close(await tiny_backend.choice_probabilities(batch, ["A", "B"]), shared)
    assert len(forwards) == 1 and forwards[0][0] == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 2), min_size=0, max_size=10).map(lambda t: [7] * 4 + t),
        max_size=14,
    ),
    st.integers(1, 12),
)
def test_prefix_tree_nests_strictly_longer_prefixes(rows: list[list[int]], min_saving: int) -> None:
    tree = prefix_tree(rows, min_saving=min_saving)
    leaves = sorted(i for item in tree for i in _leaves(item))
    assert leaves == list(range(len(rows)))

    def check(item: int | PrefixNode, parent: list[int]) -> None:
        tokens = rows[item] if isinstance(item, int) else item.tokens
        assert len(tokens) > len(parent) and list(tokens[: len(parent)]) == parent
        if isinstance(item, PrefixNode):
            assert (len(item.children) - 1) * (len(item.tokens) - len(parent)) >= min_saving
            assert len({tuple(rows[i][: len(item.tokens)]) for i in _leaves(item)}) == 1
            for child in item.children:
                check(child, item.tokens)

    for item in tree:
        check(item, [])


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


# -- sequence scoring on shared prefixes (the contrastive judge's calls) ------------------
_PERSONAS = (
    "You are a warm counselor who reflects feelings.",
    "You are a careless responder who changes the subject.",
    "You are a counselor who asks one open question at a time.",
)


def contrast_like_batch() -> tuple[list[list[ChatMessage]], list[str]]:
    """Every reply under every persona + the same conversation (as the contrastive judge
    asks), persona-major, with one unrelated prompt and a repeated reply in between."""
    turns = [ChatMessage("user", "I feel anxious about work."), ChatMessage("assistant", "Go on.")]
    prompts: list[list[ChatMessage]] = []
    responses: list[str] = []
    for persona in _PERSONAS:
        for reply in (*_REPLIES, _REPLIES[0]):
            prompts.append([ChatMessage("system", persona), *turns, ChatMessage("user", "Hm.")])
            responses.append(reply)
    prompts.insert(5, other_prompt())
    responses.insert(5, "Paris is the capital of France.")
    return prompts, responses


@pytest.mark.parametrize("adapter", [None, "v1"])
async def test_sequence_scores_on_shared_prefixes_equal_the_trainers_function(
    tiny_backend: TransformersBackend,
    tiny_adapter_paths: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    adapter: str | None,
) -> None:
    """Issue 23: the speed comes from reading shared tokens once, never from scoring
    differently: every score equals response_logprobs' (the plain path) in input order."""
    await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
    prompts, responses = contrast_like_batch()
    plain = tiny_backend._logprobs_blocking(prompts, responses, adapter, share_prefixes=False)
    forwards = _record_segments(tiny_backend, monkeypatch)
    shared = await tiny_backend.sequence_logprobs(prompts, responses, adapter=adapter)
    assert shared == pytest.approx(plain, rel=1e-5, abs=1e-4)
    assert len(set(shared)) > len(shared) // 2  # the scores really differ
    # Each persona + conversation was read once, not once per reply.
    assert len(forwards) > 1 and max(past for past, _ in forwards) >= 32
    tokens = tiny_backend.tokenizer
    whole = sum(
        len(tokens(render_prompt(tokens, p) + r, add_special_tokens=False)["input_ids"]) + 1
        for p, r in zip(prompts, responses, strict=True)
    )
    assert sum(sum(lengths) for _, lengths in forwards) < 0.6 * whole
    # Reversed input, reversed scores; one pair alone scores the same as in the batch.
    again = await tiny_backend.sequence_logprobs(prompts[::-1], responses[::-1], adapter=adapter)
    assert again == pytest.approx(shared[::-1], rel=1e-5, abs=1e-4)
    [alone] = await tiny_backend.sequence_logprobs(prompts[7:8], responses[7:8], adapter=adapter)
    assert alone == pytest.approx(shared[7], rel=1e-5, abs=1e-4)


async def test_replies_are_batched_across_personas_with_little_padding(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reply under every persona goes in one forward, not each persona's replies
    padded to the longest of them: the padded tokens of every forward that continues a
    shared prefix are at most a tenth of its tokens (_LEAF_PADDING)."""
    prompts, responses = contrast_like_batch()
    forwards = _record_segments(tiny_backend, monkeypatch)
    await tiny_backend.sequence_logprobs(prompts, responses)
    leaves = [lengths for past, lengths in forwards if past > 0 and len(lengths) > 1]
    assert leaves, "no batch continued a shared prefix"
    for lengths in leaves:
        assert sum(lengths) >= 0.9 * len(lengths) * max(lengths), lengths
    # A reply's rows (one per persona) go together: 3 personas, so batches of >= 3.
    assert all(len(lengths) >= len(_PERSONAS) for lengths in leaves)


async def test_sequence_scores_with_nothing_shared_take_the_plain_forward(
    tiny_backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [other_prompt(), [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]]
    responses = ["Paris.", ""]
    plain = tiny_backend._logprobs_blocking(prompts, responses, None, share_prefixes=False)
    forwards = _record_segments(tiny_backend, monkeypatch)
    assert await tiny_backend.sequence_logprobs(prompts, responses) == pytest.approx(
        plain, rel=1e-5, abs=1e-4
    )
    assert forwards and all(past == 0 for past, _ in forwards)  # no shared context
