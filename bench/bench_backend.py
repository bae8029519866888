"""Backend benchmark: N=5 candidates in one batched call vs 5 sequential calls.

Run: ``.venv/bin/python -m bench.bench_backend [--model tiny|smollm2|PATH]``.

Both arms use the same model, prompt and ``max_new_tokens``; every sequence is forced to
that exact length (``min_new_tokens``), so the arms do the same amount of decoding and
the ratio measures batching alone. Repetitions interleave the arms (alternating which
goes first) so drift in machine load hits both; we report medians and their ratio
(target <= 0.4x). Also: time to the first streamed delta vs a bare 1-token generate of
the same batch, the cost of the streaming path before any text reaches a client.
Figures go to bench/RESULTS.md (section "backend").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench._results import write_section
from counselor_engine.backends import ChatMessage, GenerationParams, StreamDelta
from counselor_engine.backends.transformers_backend import TransformersBackend

N = 5
PROMPT = [
    ChatMessage("system", "You are a warm, careful counselor. Reply in two sentences."),
    ChatMessage("user", "I have been feeling anxious about work and I cannot sleep."),
]


def _model_path(choice: str, workdir: Path) -> Path:
    if choice == "tiny":
        from counselor_engine.backends.tiny import build_tiny_model

        return build_tiny_model(workdir / "tiny", seed=0)
    if choice == "smollm2":
        from counselor_engine.models import ensure_default_model

        return ensure_default_model()
    return Path(choice)


async def _timed(coro) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def _sequential(backend: TransformersBackend, params: GenerationParams) -> None:
    for _ in range(N):
        await backend.generate(PROMPT, n=1, params=params)


async def _first_delta(backend: TransformersBackend, params: GenerationParams) -> float:
    start = time.perf_counter()
    stream = backend.generate_stream(PROMPT, n=N, params=params)
    elapsed = float("nan")
    async for event in stream:
        if isinstance(event, StreamDelta):
            elapsed = time.perf_counter() - start
            break
    await stream.aclose()  # ends the generation at its next step
    return elapsed


async def run(model: str, reps: int, max_new_tokens: int, threads: int | None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = _model_path(model, Path(tmp))
        backend = TransformersBackend(path, num_threads=threads)
        # Fixed-length sequences: both arms decode exactly max_new_tokens per candidate.
        backend.model.generation_config.min_new_tokens = max_new_tokens
        params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95)
        one_token = GenerationParams(max_new_tokens=1, temperature=0.8, top_p=0.95)
        await backend.generate(PROMPT, n=N, params=params)  # warm-up
        await backend.generate(PROMPT, n=1, params=params)

        batched: list[float] = []
        sequential: list[float] = []
        for rep in range(reps):
            arms = [
                ("b", backend.generate(PROMPT, n=N, params=params)),
                ("s", _sequential(backend, params)),
            ]
            for arm, coro in arms if rep % 2 == 0 else arms[::-1]:
                (batched if arm == "b" else sequential).append(await _timed(coro))

        first_delta: list[float] = []
        bare: list[float] = []
        backend.model.generation_config.min_new_tokens = None
        for _ in range(reps):
            first_delta.append(await _first_delta(backend, params))
            bare.append(await _timed(backend.generate(PROMPT, n=N, params=one_token)))

    med_b, med_s = statistics.median(batched), statistics.median(sequential)
    med_f, med_1 = statistics.median(first_delta), statistics.median(bare)
    tokens = N * max_new_tokens
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"""
Model `{model}` ({path.name}), N = {N} candidates, {max_new_tokens} new tokens each (fixed
length), {reps} interleaved repetitions, torch threads = {threads or "default"},
load average at the end {load} (the machine is shared: absolute times move, ratios less).

| measure | median | ratio |
| --- | --- | --- |
| N=5 in one batched `generate` | {med_b:.3f} s ({tokens / med_b:.1f} tok/s) | \
**{med_b / med_s:.2f}x** of sequential (target <= 0.4x) |
| 5 sequential calls, n=1 | {med_s:.3f} s ({tokens / med_s:.1f} tok/s) | 1.00x |
| first streamed delta, N=5 | {med_f * 1000:.0f} ms | \
{med_f / med_1:.2f}x of a bare 1-token generate |
| bare 1-token generate, N=5 | {med_1 * 1000:.0f} ms | |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    body = asyncio.run(run(args.model, args.reps, args.max_new_tokens, args.threads))
    print(body)
    write_section(f"backend ({args.model})", body)


if __name__ == "__main__":
    main()
