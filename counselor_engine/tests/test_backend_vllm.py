"""VLLMBackend against the fake OpenAI-compatible server: the requests it sends and every
failure mode. The real server (vLLM's CPU build, bin/vllm) is in test_vllm_live.py."""

from __future__ import annotations

import asyncio
import math
import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from counselor_engine.backends import (
    Backend,
    BackendError,
    ChatMessage,
    GenerationParams,
    StreamDelta,
    StreamDone,
    make_backend,
)
from counselor_engine.backends.vllm_backend import VLLMBackend, _renormalised
from counselor_engine.tests.fake_openai import (
    BASE_MODEL,
    UNLISTED_LOGPROB,
    FakeOpenAIServer,
    choice_logprobs,
    render,
    reply_text,
    token_logprob,
    tokenize,
)

PARAMS = GenerationParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=3)


@pytest.fixture
def backend(fake_openai: FakeOpenAIServer) -> VLLMBackend:
    return VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=5.0)


def as_dicts(prompt: list[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in prompt]


def test_it_implements_the_protocol_and_comes_from_the_factory() -> None:
    backend = make_backend("vllm", base_url="http://127.0.0.1:1/v1/", model="m")
    assert isinstance(backend, VLLMBackend) and isinstance(backend, Backend)
    assert backend.base_url == "http://127.0.0.1:1"


async def test_it_sends_n_candidates_in_one_request(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    texts = await backend.generate(chat_prompt, n=5, params=PARAMS)
    assert texts == [reply_text(BASE_MODEL, as_dicts(chat_prompt), i) for i in range(5)]
    assert fake_openai.state.paths() == ["/v1/chat/completions"]
    body = fake_openai.state.requests[0][1]
    assert body["n"] == 5 and body["model"] == BASE_MODEL
    assert body["max_tokens"] == 16 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["seed"] == 3
    assert body["messages"] == as_dicts(chat_prompt)  # our system prompt, nothing added


async def test_it_streams_candidate_zero_over_sse(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    events = [e async for e in backend.generate_stream(chat_prompt, n=3, params=PARAMS)]
    done = events[-1]
    deltas = [e for e in events[:-1] if isinstance(e, StreamDelta)]
    assert isinstance(done, StreamDone)
    assert done.texts == [reply_text(BASE_MODEL, as_dicts(chat_prompt), i) for i in range(3)]
    assert len(deltas) >= 2 and "".join(d.text for d in deltas) == done.texts[0]
    assert len(fake_openai.state.requests) == 1
    assert fake_openai.state.requests[0][1]["stream"] is True


async def test_greedy_candidates_are_one_request_for_one_reply_repeated(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    """vLLM refuses n > 1 at temperature 0; greedy candidates are all the same reply."""
    greedy = GenerationParams(max_new_tokens=16, temperature=0.0)
    one = reply_text(BASE_MODEL, as_dicts(chat_prompt), 0)
    assert await backend.generate(chat_prompt, n=3, params=greedy) == [one] * 3
    events = [e async for e in backend.generate_stream(chat_prompt, n=3, params=greedy)]
    assert isinstance(events[-1], StreamDone) and events[-1].texts == [one] * 3
    assert [b["n"] for _, b in fake_openai.state.requests] == [1, 1]


async def test_it_scores_the_choice_tokens_themselves(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    other = [chat_prompt[0], ChatMessage("user", "Hi")]
    ab = await backend.choice_probabilities([chat_prompt, other], ["A", "B"])
    likert = await backend.choice_probabilities([chat_prompt], list("12345"))
    for row in [*ab, *likert]:
        assert sum(row) == pytest.approx(1.0)
    assert ab[0] != pytest.approx(ab[1])
    table = choice_logprobs(BASE_MODEL, as_dicts(chat_prompt))
    expected = softmax([table["A"], table["B"]])
    assert ab[0] == pytest.approx(expected)
    scored = [b for p, b in fake_openai.state.requests if p == "/v1/chat/completions"]
    assert scored[0]["max_tokens"] == 1 and scored[0]["logprobs"] is True
    assert scored[0]["logprob_token_ids"] == tokenize("A") + tokenize("B")
    # Each choice is tokenized once per backend, however many prompts and calls follow.
    tokenized = [b["prompt"] for p, b in fake_openai.state.requests if p == "/tokenize"]
    assert sorted(tokenized) == sorted(["A", "B", *"12345"])


async def test_choices_far_down_the_distribution_keep_their_probability(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    # 25 tokens rank above both choices: a top-20 reading would find neither, or only A.
    table = {f"w{i}": -0.5 - i * 0.01 for i in range(25)}
    fake_openai.state.top_logprobs_override = {**table, "A": -6.0}  # B is unlisted: -9.0
    [probs] = await backend.choice_probabilities([chat_prompt], ["A", "B"])
    assert probs == pytest.approx(softmax([-6.0, UNLISTED_LOGPROB]))
    assert 0.0 < probs[1] < probs[0]


async def test_a_server_that_ignores_the_choice_ids_is_an_error_not_a_guess(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    fake_openai.state.ignore_logprob_token_ids = True
    with pytest.raises(BackendError, match="did not score the choice tokens"):
        await backend.choice_probabilities([chat_prompt], ["A", "B"])


async def test_choices_must_be_single_distinct_tokens(
    backend: VLLMBackend, chat_prompt: list[ChatMessage]
) -> None:
    with pytest.raises(ValueError, match="not a single token"):
        await backend.choice_probabilities([chat_prompt], ["A", "Bb"])
    with pytest.raises(ValueError, match="duplicate"):
        await backend.choice_probabilities([chat_prompt], ["A", "A"])


@given(st.lists(st.floats(-1e4, 0.0), min_size=1, max_size=8))
def test_renormalising_is_a_softmax_that_never_underflows(logprobs: list[float]) -> None:
    probs = _renormalised(logprobs)
    assert sum(probs) == pytest.approx(1.0)
    assert probs[logprobs.index(max(logprobs))] == max(probs) > 0.0
    assert probs == pytest.approx(softmax(logprobs), abs=1e-12)


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


async def test_sequence_logprobs_score_only_the_response(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    response = "That sounds hard."
    got = await backend.sequence_logprobs([chat_prompt], [response])
    r_ids = tokenize(response + "<|im_end|>")
    assert got == [pytest.approx(sum(token_logprob(t, BASE_MODEL) for t in r_ids))]
    paths = fake_openai.state.paths()
    assert paths.count("/tokenize") == 2 and paths[-1] == "/v1/completions"
    scored = fake_openai.state.requests[-1][1]
    p_ids = tokenize(render(as_dicts(chat_prompt), add_generation_prompt=True))
    assert scored["prompt"] == p_ids + r_ids and scored["prompt_logprobs"] == 0


async def test_adapters_load_idempotently_and_are_chosen_by_model_name(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    await backend.load_adapter("v3", "/data/adapters/v3")
    await backend.load_adapter("v3", "/data/adapters/v3")  # vLLM says 400 "already": fine
    assert fake_openai.state.adapters == {"v3": "/data/adapters/v3"}
    load = fake_openai.state.requests[0]
    assert load == ("/v1/load_lora_adapter", {"lora_name": "v3", "lora_path": "/data/adapters/v3"})

    texts = await backend.generate(chat_prompt, n=2, params=PARAMS, adapter="v3")
    assert fake_openai.state.requests[-1][1]["model"] == "v3"
    assert texts[0].startswith("[v3]")
    base_lp = await backend.sequence_logprobs([chat_prompt], ["ok"])
    v3_lp = await backend.sequence_logprobs([chat_prompt], ["ok"], adapter="v3")
    assert v3_lp != base_lp

    await backend.unload_adapter("v3")
    await backend.unload_adapter("v3")  # vLLM says 400 "cannot be found": fine
    assert fake_openai.state.adapters == {}
    with pytest.raises(BackendError, match="404"):
        await backend.generate(chat_prompt, n=1, params=PARAMS, adapter="v3")


async def test_server_errors_are_backend_errors(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    fake_openai.state.fail_status = 500
    with pytest.raises(BackendError, match="500"):
        await backend.generate(chat_prompt, n=2, params=PARAMS)
    with pytest.raises(BackendError, match="500"):
        async for _ in backend.generate_stream(chat_prompt, n=2, params=PARAMS):
            pass
    with pytest.raises(BackendError, match="500"):
        await backend.load_adapter("v1", "/x")


async def test_a_dead_engine_is_reported_at_once(
    fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    """vLLM's API process outlives a dead engine core and answers every request 500
    EngineDeadError: that must be a BackendError naming the cause, well within the
    timeout (the session then offers its retry), never a wait."""
    fake_openai.state.fail_status = 500
    fake_openai.state.fail_message = (
        "EngineCore encountered an issue. See stack trace (above) for the root cause."
    )
    backend = VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=600.0)
    with pytest.raises(BackendError, match="engine is dead"):
        await asyncio.wait_for(backend.choice_probabilities([chat_prompt], ["A", "B"]), 10)
    with pytest.raises(BackendError, match="engine is dead"):
        await asyncio.wait_for(backend.sequence_logprobs([chat_prompt], ["ok"]), 10)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_refused_connection_is_a_backend_error(chat_prompt: list[ChatMessage]) -> None:
    backend = VLLMBackend(f"http://127.0.0.1:{_closed_port()}", model="m", timeout=5.0)
    with pytest.raises(BackendError, match="unreachable"):
        await backend.generate(chat_prompt, n=1, params=PARAMS)
    with pytest.raises(BackendError, match="unreachable"):
        async for _ in backend.generate_stream(chat_prompt, n=1, params=PARAMS):
            pass


async def test_a_server_that_never_answers_times_out(
    silent_port: int, chat_prompt: list[ChatMessage]
) -> None:
    backend = VLLMBackend(f"http://127.0.0.1:{silent_port}", model="m", timeout=0.3)
    with pytest.raises(BackendError, match="timed out"):
        await backend.generate(chat_prompt, n=1, params=PARAMS)
    with pytest.raises(BackendError, match="timed out"):
        await backend.choice_probabilities([chat_prompt], ["A", "B"])


async def test_a_reply_that_trickles_in_is_bounded_in_all(
    fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    """A byte every 0.1 s never trips a per-read timeout of 0.5 s; the request's total
    bound must still end it (a wedged engine can answer like this)."""
    fake_openai.state.dribble_s = 0.1
    backend = VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=0.5)
    with pytest.raises(BackendError, match="timed out"):
        await backend.choice_probabilities([chat_prompt], ["A", "B"])


async def test_a_stream_that_stalls_times_out(
    fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    fake_openai.state.stall_stream_after = 2
    backend = VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=0.3)
    seen: list[object] = []
    with pytest.raises(BackendError, match="timed out"):
        async for event in backend.generate_stream(chat_prompt, n=1, params=PARAMS):
            seen.append(event)
    assert seen and all(isinstance(e, StreamDelta) for e in seen)


async def test_a_stream_that_trickles_is_bounded_in_all(
    fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    """A chunk every 0.1 s never trips a per-read bound of 0.5 s; the stream's total
    deadline (the backend's timeout) must still end it, within a few seconds."""
    fake_openai.state.trickle_stream_s = 0.1
    backend = VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=0.5)
    seen: list[object] = []
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"timed out after 0\.5 s"):
        async with asyncio.timeout(10):  # the bound under test, not this one, must fire
            async for event in backend.generate_stream(chat_prompt, n=1, params=PARAMS):
                seen.append(event)
    assert time.monotonic() - started < 3.0
    assert len(seen) >= 3 and all(isinstance(e, StreamDelta) for e in seen)


async def test_an_error_chunk_mid_stream_is_a_backend_error_naming_it(
    fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    """vLLM has sent 200 before a request fails, so it reports the failure as a
    ``data: {"error": ...}`` chunk followed by [DONE]: never a StreamDone."""
    fake_openai.state.stream_error_after = (2, "EngineDeadError: EngineCore encountered an issue.")
    backend = VLLMBackend(fake_openai.url, model=BASE_MODEL, timeout=5.0)
    seen: list[object] = []
    with pytest.raises(BackendError, match=r"engine is dead.*EngineCore encountered an issue"):
        async for event in backend.generate_stream(chat_prompt, n=1, params=PARAMS):
            seen.append(event)
    assert len(seen) == 2 and all(isinstance(e, StreamDelta) for e in seen)

    fake_openai.state.stream_error_after = (0, "Internal server error")
    with pytest.raises(BackendError, match=r"InternalServerError 500.*Internal server error"):
        async for _ in backend.generate_stream(chat_prompt, n=1, params=PARAMS):
            pass
