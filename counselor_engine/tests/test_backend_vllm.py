"""VLLMBackend against the fake OpenAI-compatible server, failure modes, and (where a GPU
and a live server exist) the real thing."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from counselor_engine.backends import (
    Backend,
    BackendError,
    ChatMessage,
    GenerationParams,
    StreamDelta,
    StreamDone,
    make_backend,
)
from counselor_engine.backends.vllm_backend import VLLMBackend
from counselor_engine.tests.fake_openai import (
    BASE_MODEL,
    FakeOpenAIServer,
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


async def test_it_reads_choice_probabilities_from_top_logprobs(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    other = [chat_prompt[0], ChatMessage("user", "Hi")]
    ab = await backend.choice_probabilities([chat_prompt, other], ["A", "B"])
    likert = await backend.choice_probabilities([chat_prompt], list("12345"))
    for row in [*ab, *likert]:
        assert sum(row) == pytest.approx(1.0)
    assert ab[0] != pytest.approx(ab[1])
    body = fake_openai.state.requests[0][1]
    assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 20


async def test_missing_choices_get_zero_and_all_missing_is_an_error(
    backend: VLLMBackend, fake_openai: FakeOpenAIServer, chat_prompt: list[ChatMessage]
) -> None:
    fake_openai.state.top_logprobs_override = {"A": -1.0, "The": -0.1}
    assert await backend.choice_probabilities([chat_prompt], ["A", "B"]) == [[1.0, 0.0]]
    fake_openai.state.top_logprobs_override = {"The": -0.1}
    with pytest.raises(BackendError, match="none of the choices"):
        await backend.choice_probabilities([chat_prompt], ["A", "B"])


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


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


async def test_a_server_that_never_answers_times_out(
    silent_port: int, chat_prompt: list[ChatMessage]
) -> None:
    backend = VLLMBackend(f"http://127.0.0.1:{silent_port}", model="m", timeout=0.3)
    with pytest.raises(BackendError, match="timed out"):
        await backend.generate(chat_prompt, n=1, params=PARAMS)
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


# -- a live vLLM server (GPU machines only) --------------------------------------------------

VLLM_URL = os.environ.get("PSYEVO_VLLM_URL")


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(
    not VLLM_URL or not _gpu_available(),
    reason="needs a GPU and a running vLLM server: set PSYEVO_VLLM_URL (and PSYEVO_VLLM_MODEL, "
    "PSYEVO_VLLM_ADAPTER for the adapter check)",
)
async def test_a_real_vllm_server(chat_prompt: list[ChatMessage]) -> None:
    assert VLLM_URL is not None
    model = os.environ.get("PSYEVO_VLLM_MODEL", "smollm2")
    backend = VLLMBackend(VLLM_URL, model=model, timeout=120.0)
    texts = await backend.generate(chat_prompt, n=5, params=PARAMS)
    assert len(texts) == 5
    events = [e async for e in backend.generate_stream(chat_prompt, n=2, params=PARAMS)]
    assert isinstance(events[-1], StreamDone) and len(events[-1].texts) == 2
    probs = await backend.choice_probabilities([chat_prompt], ["A", "B"])
    assert sum(probs[0]) == pytest.approx(1.0)
    lps = await backend.sequence_logprobs([chat_prompt, chat_prompt], ["I hear you.", "No."])
    assert all(lp < 0 for lp in lps)
    if adapter_path := os.environ.get("PSYEVO_VLLM_ADAPTER"):
        await backend.load_adapter("psyevo-test", adapter_path)
        await backend.load_adapter("psyevo-test", adapter_path)
        assert (
            len(await backend.generate(chat_prompt, n=2, params=PARAMS, adapter="psyevo-test")) == 2
        )
        await backend.unload_adapter("psyevo-test")
