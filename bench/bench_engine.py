"""Engine overhead per turn and time to first streamed token (issue: engine pipeline).

Runs real sessions on one model (SmolLM2 when prepared, else the tiny in-code model) and
reports, in one process:

1. Engine overhead per turn excluding model calls: wall time of ``Counselor.respond``
   minus the time spent inside backend calls, as a share of that model time (target < 5%).
2. Time to the first text shown in ``stream_first`` mode (the first sentence the output
   guard passed) vs a bare stream of the same call reaching the same sentence (target
   <= 1.1x); see :func:`first_token`.

Backend time is measured by a transparent wrapper around the real backend; the memory
embedder is warmed up first so its one-off model load is not billed to a turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench._results import write_section
from counselor_engine.backends.base import (
    Backend,
    GenerationParams,
    Prompt,
    StreamDelta,
    StreamEvent,
)
from counselor_engine.counselor import ClientState, Counselor, CounselorConfig, TokenEvent
from counselor_engine.memory import MemoryStore
from counselor_engine.output_guard import SentenceGate
from counselor_engine.text import strip_control

MESSAGES = [
    "I have been feeling anxious about work for weeks",
    "My manager criticises everything I do",
    "I lie awake at night going over my mistakes",
    "Maybe I should look for another job but I'm scared",
]


class TimedBackend:
    """Forwards every call to ``inner`` and adds up the time spent inside it, in all
    (``seconds``) and by kind (``by_kind``: "generate" or "judge"); keeps each generation
    call's arguments (``generations``) so a bench can replay the same call bare."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = f"timed-{inner.name}"
        self.seconds = 0.0
        self.by_kind: dict[str, float] = {}
        self.generations: list[tuple[Prompt, dict[str, Any]]] = []

    async def _timed(self, awaitable: Any, kind: str) -> Any:
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            spent = time.perf_counter() - start
            self.seconds += spent
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + spent

    async def generate(self, prompt: Prompt, **kwargs: Any) -> list[str]:
        self.generations.append((prompt, dict(kwargs)))
        return await self._timed(self.inner.generate(prompt, **kwargs), "generate")

    async def generate_stream(self, prompt: Prompt, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        self.generations.append((prompt, dict(kwargs)))
        stream = self.inner.generate_stream(prompt, **kwargs).__aiter__()
        while True:
            try:
                event = await self._timed(stream.__anext__(), "generate")
            except StopAsyncIteration:
                return
            yield event

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], **kw: Any
    ) -> Any:
        return await self._timed(self.inner.choice_probabilities(prompts, choices, **kw), "judge")

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], **kw: Any
    ) -> Any:
        return await self._timed(self.inner.sequence_logprobs(prompts, responses, **kw), "judge")

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        await self.inner.load_adapter(name, path, sha256=sha256)

    async def unload_adapter(self, name: str) -> None:
        await self.inner.unload_adapter(name)


def model_path(choice: str) -> tuple[str, Path]:
    from counselor_engine.models import default_model_dir, is_model_dir

    if choice in ("auto", "smollm2") and is_model_dir(default_model_dir()):
        return "smollm2", default_model_dir()
    if choice == "smollm2":
        sys.exit("SmolLM2 is not prepared: run `python -m counselor_engine prepare-model`")
    from counselor_engine.backends.tiny import build_tiny_model

    return "tiny", build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")))


async def overhead(backend: Backend, config: CounselorConfig, sessions: int) -> dict[str, float]:
    timed = TimedBackend(backend)
    walls, models = [], []
    for s in range(sessions):
        client = ClientState(f"bench-{s}", "cbt", s % 4, 4, memory=MemoryStore())
        client.memory.add("goal", "sleep better and worry less about work")
        counselor = Counselor(timed, config=config)  # type: ignore[arg-type]
        counselor.start_session(client, None)
        for message in MESSAGES:
            timed.seconds = 0.0
            start = time.perf_counter()
            async for _ in counselor.respond(message):
                pass
            walls.append(time.perf_counter() - start)
            models.append(timed.seconds)
    wall, model = sum(walls), sum(models)
    return {"turns": len(walls), "wall": wall, "model": model, "overhead": (wall - model) / model}


async def first_token(backend: Backend, config: CounselorConfig, reps: int) -> dict[str, Any]:
    """Time to the first text a client sees in ``stream_first`` mode, against a bare stream.

    The engine shows candidate 0 one whole sentence at a time, each checked by the output
    guard first (:class:`output_guard.SentenceGate`): its first text is the first
    sentence, which needs every token up to the white space after the sentence's end.
    The bare arm replays the engine's own stream call (same prompt, parameters and seed,
    so the same tokens) and stops where a sentence gate passes its first sentence; the
    ratio is then the engine's cost on top of the model (target <= 1.1x). The bare
    stream's first delta (one token, no sentence whole yet) is reported beside it: the
    difference is the wait the sentence-at-a-time guard adds, by design.
    """
    engine, bare, first_delta, same = [], [], [], []
    for r in range(reps):
        rec = TimedBackend(backend)
        client = ClientState(f"ttft-{r}", "cbt", 0, 4, memory=MemoryStore())
        counselor = Counselor(rec, config=config)  # type: ignore[arg-type]
        counselor.start_session(client, None)
        shown = ""
        start = time.perf_counter()
        respond = counselor.respond(MESSAGES[0])
        async for event in respond:
            if isinstance(event, TokenEvent):
                engine.append(time.perf_counter() - start)
                shown = event.text
                break
        await respond.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # let the abandoned generation stop before the bare call
        (prompt, kwargs), *_ = rec.generations
        gate, passed = SentenceGate(), ""
        start = time.perf_counter()
        stream = backend.generate_stream(prompt, **kwargs)
        async for item in stream:
            if isinstance(item, StreamDelta) and item.index == 0 and item.text:
                if len(first_delta) == r:
                    first_delta.append(time.perf_counter() - start)
                passed = gate.feed(strip_control(item.text))
                if passed:
                    bare.append(time.perf_counter() - start)
                    break
        else:  # a reply of one unfinished sentence: the engine shows it at the end
            passed = gate.finish()
            bare.append(time.perf_counter() - start)
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)
        same.append(passed == shown)
    return {
        "engine": statistics.median(engine),
        "bare": statistics.median(bare),
        "delta": statistics.median(first_delta),
        "same": all(same),
    }


async def main_async(args: argparse.Namespace) -> None:
    from counselor_engine.backends.transformers_backend import TransformersBackend

    name, path = model_path(args.model)
    backend = TransformersBackend(path)
    params = GenerationParams(max_new_tokens=args.tokens, temperature=0.9, top_p=0.95)
    graph = CounselorConfig(n_candidates=args.n, generation=params, seed=1)
    warm = MemoryStore()
    warm.add("fact", "warm up")
    warm.retrieve("warm up the embedder", k=1)
    result = await overhead(backend, graph, args.sessions)
    stream = CounselorConfig(n_candidates=args.n, generation=params, mode="stream_first", seed=2)
    ttft = await first_token(backend, stream, args.reps)
    ratio = ttft["engine"] / ttft["bare"]
    body = f"""Model `{name}`, N = {args.n} candidates, {args.tokens} new tokens, twelve judge
criteria in both orders; {result["turns"]} turns over {args.sessions} sessions (graph mode).

| measure | value | target |
| --- | --- | --- |
| wall time of all turns | {result["wall"]:.2f} s | |
| time inside model calls | {result["model"]:.2f} s | |
| engine overhead excluding model calls | **{100 * result["overhead"]:.2f}%** of model time | < 5% |
| first text shown, stream_first engine (its first guarded sentence) | {1000 * ttft["engine"]:.0f} ms | |
| the same sentence from a bare stream of the same call | {1000 * ttft["bare"]:.0f} ms | |
| engine / bare | **{ratio:.2f}x** | <= 1.1x |
| first streamed delta (one token), bare stream | {1000 * ttft["delta"]:.0f} ms | |

Time to first text, medians of {args.reps}; the bare arm replays the engine's stream call
(same prompt, parameters and seed) and stops where a sentence gate passes its first
sentence, which was the engine's first text in every repetition: **{ttft["same"]}**. The
gap between the first delta and the first sentence is the output guard's sentence-at-a-time
wait, by design (a sentence is shown only after it is checked).
"""
    print(body)
    write_section(f"engine ({name})", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("auto", "smollm2", "tiny"), default="auto")
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
