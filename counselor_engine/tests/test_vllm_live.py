"""The vLLM backend against a real vLLM server (its CPU build here, bin/vllm), checked
against the transformers backend on the same model (SmolLM2-135M-Instruct).

The server computes in bfloat16, the transformers backend in float32: probabilities agree
to a few thousandths, sums of log-probabilities to well under 1%, and greedy replies for
their first words, until one near-tie between two tokens rounds the other way.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from counselor_engine import models
from counselor_engine.backends import BackendError, ChatMessage, GenerationParams, StreamDelta
from counselor_engine.backends import StreamDone as Done
from counselor_engine.backends.tiny import build_tiny_adapter
from counselor_engine.backends.transformers_backend import TransformersBackend
from counselor_engine.backends.vllm_backend import VLLMBackend
from counselor_engine.judge import Judge, JudgeContext, default_criteria
from counselor_engine.tests import vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800)]

GREEDY = GenerationParams(max_new_tokens=32, temperature=0.0, top_p=1.0, seed=0)
COUNSEL = [
    ChatMessage("system", "You are a supportive counselor. Answer in one sentence."),
    ChatMessage("user", "I have been feeling stressed about my exams."),
]
JUDGE_AB = [
    ChatMessage("system", "You compare two replies. Answer with one letter: A or B."),
    ChatMessage(
        "user",
        "Client: I feel lonely.\nA: That sounds painful; tell me more.\nB: Whatever.\n"
        "Which reply is more empathic? Answer A or B.",
    ),
]
# Nothing here asks for a letter: on SmolLM2 "A" is far outside the top 20 next tokens
# (the old top-20 reading gave A exactly 0; the transformers backend gives it ~0.08).
FAR_DOWN = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Tell me about Paris."),
]
PROMPTS = [
    JUDGE_AB,
    [ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", "A or B?")],
    [ChatMessage("system", "You are a poet."), ChatMessage("user", "Write about the sea.")],
    FAR_DOWN,
]
HISTORY = (("client", "Hello."), ("counselor", "Hi, I am here."))
RESPONSES = [
    "That sounds really hard. Can you tell me more?",
    "I hear you.",
    "Exams can be a lot; what part of them worries you most?",
]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return models.ensure_default_model()


@pytest.fixture(scope="module")
def reference(smollm2: Path) -> TransformersBackend:
    return TransformersBackend(smollm2)


@pytest.fixture(scope="module")
def smollm2_adapter(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA on SmolLM2's attention (non-zero B, so it changes the model)."""
    return build_tiny_adapter(
        smollm2, tmp_path_factory.mktemp("smollm2-lora") / "lora", seed=7, rank=8, scale=0.02
    )


@pytest.fixture
def vllm(vllm_url: str) -> VLLMBackend:
    # Generous: the 2 cores are shared with whatever else runs on the machine.
    return VLLMBackend(vllm_url, model=vllm_server.SERVED_NAME, timeout=600.0)


@pytest.fixture
def loaded(vllm: VLLMBackend, smollm2_adapter: Path) -> Iterator[str]:
    name = "psyevo-test-lora"
    asyncio.run(vllm.load_adapter(name, str(smollm2_adapter)))
    yield name
    asyncio.run(vllm.unload_adapter(name))


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- parity ---------------------------------------------------------------------------------
async def test_greedy_replies_agree_and_n_samples_come_in_one_call(
    vllm: VLLMBackend, reference: TransformersBackend
) -> None:
    [ours] = await vllm.generate(COUNSEL, n=1, params=GREEDY)
    [theirs] = await reference.generate(COUNSEL, n=1, params=GREEDY)
    assert common_prefix(ours, theirs) >= 16, (ours, theirs)  # measured: 57 characters
    sampled = await vllm.generate(
        COUNSEL, n=5, params=GenerationParams(max_new_tokens=24, temperature=0.9, seed=1)
    )
    assert len(sampled) == 5 and all(t.strip() for t in sampled)
    assert len(set(sampled)) > 1


async def test_the_stream_is_the_reply(vllm: VLLMBackend) -> None:
    [plain] = await vllm.generate(COUNSEL, n=1, params=GREEDY)
    events = [e async for e in vllm.generate_stream(COUNSEL, n=2, params=GREEDY)]
    done = events[-1]
    deltas = [e.text for e in events[:-1] if isinstance(e, StreamDelta)]
    assert isinstance(done, Done) and len(done.texts) == 2
    assert len(deltas) > 3 and "".join(deltas) == done.texts[0] == plain


async def test_choice_probabilities_agree_within_five_hundredths(
    vllm: VLLMBackend, reference: TransformersBackend
) -> None:
    for choices in (["A", "B"], list("12345")):
        ours = await vllm.choice_probabilities(PROMPTS, choices)
        theirs = await reference.choice_probabilities(PROMPTS, choices)
        for row, ref in zip(ours, theirs, strict=True):
            assert sum(row) == pytest.approx(1.0)
            assert max(abs(p - q) for p, q in zip(row, ref, strict=True)) < 0.05, (row, ref)


async def test_choices_far_down_the_list_keep_their_probability(
    vllm: VLLMBackend, vllm_url: str, reference: TransformersBackend
) -> None:
    async with httpx.AsyncClient(base_url=vllm_url, timeout=120, trust_env=False) as client:
        reply = await client.post(
            "/v1/chat/completions",
            json={
                "model": vllm_server.SERVED_NAME,
                "messages": [{"role": m.role, "content": m.content} for m in FAR_DOWN],
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": True,
                "top_logprobs": 20,
            },
        )
    top20 = [
        e["token"] for e in reply.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    ]
    assert len(top20) == 20 and "A" not in top20  # the case the top-k reading got wrong

    [ours] = await vllm.choice_probabilities([FAR_DOWN], ["A", "B"])
    [theirs] = await reference.choice_probabilities([FAR_DOWN], ["A", "B"])
    assert ours[0] > 0.01
    assert abs(ours[0] - theirs[0]) < 0.05, (ours, theirs)


async def test_sequence_logprobs_agree_within_five_percent_with_and_without_an_adapter(
    vllm: VLLMBackend, reference: TransformersBackend, loaded: str, smollm2_adapter: Path
) -> None:
    await reference.load_adapter(loaded, str(smollm2_adapter))
    try:
        for adapter in (None, loaded):
            ours = await vllm.sequence_logprobs([COUNSEL] * 3, RESPONSES, adapter=adapter)
            theirs = await reference.sequence_logprobs([COUNSEL] * 3, RESPONSES, adapter=adapter)
            for a, b in zip(ours, theirs, strict=True):
                assert a < 0 and abs(a - b) <= 0.05 * abs(b), (adapter, ours, theirs)
        base = await vllm.sequence_logprobs([COUNSEL], RESPONSES[:1])
        tuned = await vllm.sequence_logprobs([COUNSEL], RESPONSES[:1], adapter=loaded)
        assert base != pytest.approx(tuned, abs=1e-3)  # the adapter really is applied
    finally:
        await reference.unload_adapter(loaded)


# -- load with LoRA -------------------------------------------------------------------------
async def test_twenty_concurrent_judge_passes_with_lora_keep_the_server_healthy(
    vllm: VLLMBackend, vllm_url: str, loaded: str
) -> None:
    """Judge passes (base model) mixed, step by step, with generation and prompt scoring
    under an adapter: the mix that killed the engine before --lora-target-modules. Three
    criteria per pass keep it to 160 judge requests (2 cores)."""
    judge = Judge(vllm, criteria=default_criteria()[:3])
    contexts = [JudgeContext(HISTORY, f"I feel low ({i}).", "RF") for i in range(20)]
    candidates = ["That sounds heavy. What has today been like?", "Okay. Next question."]
    passes = [judge.judge_group(ctx, candidates) for ctx in contexts]
    scoring = vllm.sequence_logprobs([COUNSEL] * 4, [*RESPONSES, "No."], adapter=loaded)
    drafting = vllm.generate(
        COUNSEL, n=5, params=GenerationParams(max_new_tokens=16, seed=3), adapter=loaded
    )
    *groups, lps, drafts = await asyncio.gather(*passes, scoring, drafting)

    assert all(g.admissible and len(g.judgments) == 2 * 3 for g in groups)
    assert all(all(1.0 <= s <= 5.0 for s in g.pointwise) for g in groups)
    assert len(lps) == 4 and all(lp < 0 for lp in lps) and len(drafts) == 5
    assert vllm_server.healthy(vllm_url)


# -- a dead engine --------------------------------------------------------------------------
class _EndlessReplies(VLLMBackend):
    """The backend's own requests, asking vLLM to ignore the end-of-sequence token: a
    reply that may end after a few words could finish before the engine is killed (it
    did in CI), and then there is nothing in flight to fail."""

    def _chat_body(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        body = super()._chat_body(*args, **kwargs)
        body["ignore_eos"] = True
        return body


@pytest.fixture
def own_server(smollm2: Path, tmp_path: Path) -> Iterator[str]:
    """A server of its own (bin/vllm on a free port): killing its engine must not disturb
    the server the other tests share, whatever order they run in."""
    with vllm_server.started_server(tmp_path / "bin-vllm.log", smollm2) as url:
        yield url


async def test_a_dead_engine_is_a_backend_error_and_bin_vllm_brings_it_back(
    own_server: str,
) -> None:
    """The engine core is killed while a plain and a streamed reply are being written:
    both fail fast with BackendError (the plain one answered 500 EngineDeadError, the
    stream told in-band), never hang; later requests fail while the server is down, and
    the supervisor starts a fresh server that answers again."""
    vllm = _EndlessReplies(own_server, model=vllm_server.SERVED_NAME, timeout=600.0)
    engines = vllm_server.engine_core_pids(own_server)
    assert engines, "no engine core found"
    endless = GenerationParams(max_new_tokens=2000, temperature=0.9, seed=5)
    plain = asyncio.create_task(vllm.generate(COUNSEL, n=3, params=endless))
    stream = vllm.generate_stream(COUNSEL, n=1, params=endless)
    first = await asyncio.wait_for(anext(stream), timeout=300)
    assert isinstance(first, StreamDelta)  # both requests are in the engine's batch now
    for pid in engines:
        os.kill(pid, signal.SIGKILL)

    dead = r"engine is dead|unreachable|answered 5"
    with pytest.raises(BackendError, match=dead):
        await asyncio.wait_for(_drain(stream), timeout=120)  # not the 600 s a hang takes
    with pytest.raises(BackendError, match=dead):
        await asyncio.wait_for(plain, timeout=120)
    with pytest.raises(BackendError, match=dead):
        await vllm.generate(COUNSEL, n=1, params=GREEDY)

    # The dying server may answer /health a moment longer; then the new one starts.
    await asyncio.to_thread(vllm_server.wait_unhealthy, own_server, 60.0)
    await asyncio.to_thread(vllm_server.wait_healthy, own_server, 600.0)
    [again] = await VLLMBackend(own_server, model=vllm_server.SERVED_NAME).generate(
        COUNSEL, n=1, params=GREEDY
    )
    assert again.strip()
    assert set(vllm_server.engine_core_pids(own_server)).isdisjoint(engines)


async def _drain(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass
