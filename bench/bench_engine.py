"""Engine overhead per turn and time to first streamed token (issue: engine pipeline).

Runs real sessions on one model (SmolLM2 when prepared, else the tiny in-code model) and
reports, in one process:

1. Engine overhead per turn excluding model calls: wall time of ``Counselor.respond``
   minus the time spent inside backend calls, as a share of that model time (target < 5%).
2. Time to first streamed token in ``stream_first`` mode vs the bare backend's first
   streamed delta for the same prompt (target <= 1.1x).

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
from counselor_engine.backends.base import Backend, GenerationParams, Prompt, StreamEvent
from counselor_engine.counselor import ClientState, Counselor, CounselorConfig, TokenEvent
from counselor_engine.memory import MemoryStore

MESSAGES = [
    "I have been feeling anxious about work for weeks",
    "My manager criticises everything I do",
    "I lie awake at night going over my mistakes",
    "Maybe I should look for another job but I'm scared",
]


class TimedBackend:
    """Forwards every call to ``inner`` and adds up the time spent inside it."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = f"timed-{inner.name}"
        self.seconds = 0.0

    async def _timed(self, awaitable: Any) -> Any:
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.seconds += time.perf_counter() - start

    async def generate(self, prompt: Prompt, **kwargs: Any) -> list[str]:
        return await self._timed(self.inner.generate(prompt, **kwargs))

    async def generate_stream(self, prompt: Prompt, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        stream = self.inner.generate_stream(prompt, **kwargs).__aiter__()
        while True:
            try:
                event = await self._timed(stream.__anext__())
            except StopAsyncIteration:
                return
            yield event

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], **kw: Any
    ) -> Any:
        return await self._timed(self.inner.choice_probabilities(prompts, choices, **kw))

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], **kw: Any
    ) -> Any:
        return await self._timed(self.inner.sequence_logprobs(prompts, responses, **kw))

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


async def first_token(backend: Backend, config: CounselorConfig, reps: int) -> dict[str, float]:
    engine, bare = [], []
    for r in range(reps):
        client = ClientState(f"ttft-{r}", "cbt", 0, 4, memory=MemoryStore())
        counselor = Counselor(backend, config=config)
        counselor.start_session(client, None)
        start = time.perf_counter()
        async for event in counselor.respond(MESSAGES[0]):
            if isinstance(event, TokenEvent):
                engine.append(time.perf_counter() - start)
                break
        prompt = counselor._prompt(MESSAGES[0], "CBT1", concern=False)
        start = time.perf_counter()
        stream = backend.generate_stream(prompt, n=config.n_candidates, params=config.generation)
        async for _ in stream:
            bare.append(time.perf_counter() - start)
            break
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # let the abandoned generations stop before the next rep
    return {"engine": statistics.median(engine), "bare": statistics.median(bare)}


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
| first streamed token, stream_first engine | {1000 * ttft["engine"]:.0f} ms | |
| first streamed delta, bare backend | {1000 * ttft["bare"]:.0f} ms | |
| engine / bare | **{ratio:.2f}x** | <= 1.1x |
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
