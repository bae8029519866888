"""The model in a child process answers exactly like the model in-process, and survives its
child dying: pending calls fail clearly, the next call starts a fresh child with the
adapters the old one had."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from counselor_engine.backends.adapter_files import AdapterRefused, files_digest, read_adapter_files
from counselor_engine.backends.base import BackendError, GenerationParams, StreamDelta, StreamDone
from counselor_engine.backends.process_backend import ProcessBackend

SEEDED = GenerationParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)


@pytest.fixture(scope="module")
def shared_child(tiny_model_path: Path) -> AsyncIterator[ProcessBackend]:
    """One child for the module (starting one costs a few seconds: torch is imported)."""
    backend = ProcessBackend("transformers", {"model_path": str(tiny_model_path)}, nice=0)
    yield backend
    backend.close()


async def test_generate_matches_in_process(shared_child, tiny_backend, chat_prompt) -> None:
    here = await tiny_backend.generate(chat_prompt, n=3, params=SEEDED)
    there = await shared_child.generate(chat_prompt, n=3, params=SEEDED)
    assert there == here
    assert len(there) == 3


async def test_choice_probabilities_and_logprobs_match(
    shared_child, tiny_backend, chat_prompt
) -> None:
    prompts = [chat_prompt, [*chat_prompt[:1], chat_prompt[1].__class__("user", "Hello")]]
    here = await tiny_backend.choice_probabilities(prompts, ["A", "B"])
    there = await shared_child.choice_probabilities(prompts, ["A", "B"])
    assert [p for row in there for p in row] == pytest.approx(
        [p for row in here for p in row], abs=1e-6
    )
    assert all(sum(row) == pytest.approx(1.0) for row in there)
    lp_here = await tiny_backend.sequence_logprobs(prompts, ["I hear you.", "Tell me more."])
    lp_there = await shared_child.sequence_logprobs(prompts, ["I hear you.", "Tell me more."])
    assert lp_there == pytest.approx(lp_here, abs=1e-5)


async def test_stream_deltas_add_up_to_candidate_zero(shared_child, chat_prompt) -> None:
    deltas: list[str] = []
    done: list[str] = []
    async for event in shared_child.generate_stream(chat_prompt, n=2, params=SEEDED):
        if isinstance(event, StreamDelta):
            assert event.index == 0
            deltas.append(event.text)
        else:
            assert isinstance(event, StreamDone)
            done = event.texts
    assert len(done) == 2
    assert "".join(deltas) == done[0]


async def test_a_stream_closed_early_leaves_the_child_usable(shared_child, chat_prompt) -> None:
    long = GenerationParams(max_new_tokens=200, temperature=0.9, seed=3)
    stream = shared_child.generate_stream(chat_prompt, n=1, params=long)
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            assert isinstance(event, StreamDelta)
            break
    assert len(await shared_child.generate(chat_prompt, n=1, params=SEEDED)) == 1


async def test_concurrent_calls_each_get_their_own_answer(shared_child, chat_prompt) -> None:
    params = [GenerationParams(max_new_tokens=8, seed=s) for s in (1, 2, 3)]
    together = await asyncio.gather(
        *(shared_child.generate(chat_prompt, n=1, params=p) for p in params)
    )
    alone = [await shared_child.generate(chat_prompt, n=1, params=p) for p in params]
    assert together == alone


async def test_errors_cross_the_process_boundary(shared_child, chat_prompt) -> None:
    with pytest.raises(BackendError, match="nope"):
        await shared_child.generate(chat_prompt, n=1, params=SEEDED, adapter="nope")
    assert len(await shared_child.generate(chat_prompt, n=1, params=SEEDED)) == 1


async def test_an_adapter_whose_files_changed_is_refused_in_the_child(
    shared_child, tiny_adapter_paths
) -> None:
    """The child hashes the folder right before it reads it: a digest that does not match
    (the files changed since the caller verified them) loads nothing, and the refusal
    keeps its type across the pipe so the caller can refuse the version."""
    path = tiny_adapter_paths["v2"]
    approved = files_digest(read_adapter_files(path))
    with pytest.raises(AdapterRefused, match="do not match"):
        await shared_child.load_adapter("v2", str(path), sha256="0" * 64)
    with pytest.raises(BackendError, match="load it first"):
        await shared_child.generate([], n=1, params=SEEDED, adapter="v2")
    await shared_child.load_adapter("v2", str(path), sha256=approved)
    await shared_child.unload_adapter("v2")


async def test_a_model_that_cannot_load_is_a_clear_backend_error(tmp_path: Path) -> None:
    backend = ProcessBackend("transformers", {"model_path": str(tmp_path / "missing")})
    with pytest.raises(BackendError, match="cannot start the model backend"):
        await backend.generate([], n=1, params=SEEDED)
    assert backend.pid is None


def test_negative_nice_is_refused() -> None:
    with pytest.raises(ValueError, match="nice"):
        ProcessBackend("transformers", {}, nice=-1)


async def test_child_death_fails_pending_calls_then_restarts_with_adapters(
    tiny_model_path, tiny_adapter_paths, tiny_backend, chat_prompt
) -> None:
    backend = ProcessBackend("transformers", {"model_path": str(tiny_model_path)}, nice=0)
    try:
        await backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
        first_pid = backend.pid
        assert first_pid is not None
        long = GenerationParams(max_new_tokens=4000, temperature=0.9, seed=5)
        stream = backend.generate_stream(chat_prompt, n=2, params=long)
        async with contextlib.aclosing(stream) as events:
            first = await anext(events)  # the child is generating now
            assert isinstance(first, StreamDelta)
            os.kill(first_pid, signal.SIGKILL)
            with pytest.raises(BackendError, match="exited"):
                async for _ in events:  # deltas already in the pipe may still arrive
                    pass
        # The next call starts a new child that still knows adapter v1.
        there = await backend.generate(chat_prompt, n=1, params=SEEDED, adapter="v1")
        assert backend.pid not in (None, first_pid)
        await tiny_backend.load_adapter("v1", str(tiny_adapter_paths["v1"]))
        assert there == await tiny_backend.generate(chat_prompt, n=1, params=SEEDED, adapter="v1")
    finally:
        backend.close()
    assert backend.pid is None
