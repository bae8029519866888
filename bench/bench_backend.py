"""Backend benchmark: N=5 candidates in one batched call vs 5 sequential calls; with
``--vllm``, the vLLM server against the transformers backend on the same model.

Run: ``.venv/bin/python -m bench.bench_backend [--model tiny|smollm2|PATH]``, or
``.venv/bin/python -m bench.bench_backend --vllm [--vllm-url URL]`` (SmolLM2; without a
URL ``bin/vllm`` is started for the run and stopped after it).

Both arms use the same model, prompt and ``max_new_tokens``; every sequence is forced to
that exact length (``min_new_tokens``), so the arms do the same amount of decoding and
the ratio measures batching alone. Repetitions interleave the arms (alternating which
goes first) so drift in machine load hits both; we report medians and their ratio
(target <= 0.4x). Also: time to the first streamed delta vs a bare 1-token generate of
the same batch, the cost of the streaming path before any text reaches a client.
Figures go to bench/RESULTS.md (section "backend").

The vLLM arm (section "backend (vllm vs transformers)") sends both backends the same
prompt: N=5 candidates of a fixed length (``min_new_tokens`` for transformers,
``min_tokens`` for vLLM, so both decode the same number of tokens) and one full judge
pass (5 pointwise + 240 pairwise prompts), arms interleaved. The transformers backend
runs in this process with the given torch threads, the vLLM server in its own process
bound to the same cores; one arm runs at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


JUDGE_CONTEXT_HISTORY = (
    ("client", "Work has been piling up for weeks."),
    ("counselor", "That sounds exhausting. What weighs on you most?"),
)
JUDGE_CANDIDATES = (
    "It makes sense that you feel worn out. What would help tonight?",
    "Have you tried making a list?",
    "That sounds really hard. Can you tell me more about the nights?",
    "Sleep matters. You should sleep more.",
    "I hear how much you are carrying. Which part of work keeps you awake?",
)


async def _judge_pass(backend: Any) -> float:
    from counselor_engine.judge import Judge, JudgeContext

    context = JudgeContext(
        JUDGE_CONTEXT_HISTORY, "I have been feeling anxious about work and I cannot sleep.", "RF"
    )
    start = time.perf_counter()
    group = await Judge(backend).judge_group(context, JUDGE_CANDIDATES)
    elapsed = time.perf_counter() - start
    if not group.admissible:
        raise RuntimeError(f"judge pass not admissible: {group.problem}")
    return elapsed


def _fixed_length_vllm(url: str, model: str, tokens: int) -> Any:
    """A VLLMBackend whose generation requests carry ``min_tokens``: fixed length, like
    ``min_new_tokens`` on the transformers side (a bench-only setting)."""
    from counselor_engine.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(url, model=model, timeout=1800.0)
    chat_body = backend._chat_body

    def body(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**chat_body(*args, **kwargs), "min_tokens": tokens}

    backend._chat_body = body  # type: ignore[method-assign]
    return backend


async def run_vllm(url: str, reps: int, max_new_tokens: int, threads: int | None) -> str:
    from counselor_engine.backends.vllm_backend import VLLMBackend
    from counselor_engine.models import ensure_default_model
    from counselor_engine.tests.vllm_server import SERVED_NAME

    path = ensure_default_model()
    ref = TransformersBackend(path, num_threads=threads)
    ref.model.generation_config.min_new_tokens = max_new_tokens
    fast = _fixed_length_vllm(url, SERVED_NAME, max_new_tokens)
    judge_vllm = VLLMBackend(url, model=SERVED_NAME, timeout=1800.0)
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95)
    for backend in (ref, fast):  # warm-up
        await backend.generate(PROMPT, n=N, params=params)

    gen: dict[str, list[float]] = {"transformers": [], "vllm": []}
    judge: dict[str, list[float]] = {"transformers": [], "vllm": []}
    started = time.perf_counter()
    for rep in range(reps):
        arms = [("transformers", ref, ref), ("vllm", fast, judge_vllm)]
        for name, generator, scorer in arms if rep % 2 == 0 else arms[::-1]:
            gen[name].append(await _timed(generator.generate(PROMPT, n=N, params=params)))
            judge[name].append(await _judge_pass(scorer))
    wall = time.perf_counter() - started
    g_t, g_v = statistics.median(gen["transformers"]), statistics.median(gen["vllm"])
    j_t, j_v = statistics.median(judge["transformers"]), statistics.median(judge["vllm"])
    tokens = N * max_new_tokens
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"""
Model SmolLM2-135M-Instruct: the transformers backend (float32, in process, torch threads
= {threads or "default"}) against vLLM's CPU build 0.32.0 (bfloat16, `bin/vllm`, LoRA
enabled, threads bound to the same 2 cores), the same prompt. {reps} interleaved
repetitions of each arm, medians; load average at the end {load} (the machine is shared:
absolute times move, ratios less). Bench wall time {wall:.0f} s.

| measure | transformers | vLLM | vLLM / transformers |
| --- | --- | --- | --- |
| N=5 in one call, {max_new_tokens} tokens each (fixed) | {g_t:.2f} s ({tokens / g_t:.1f} tok/s) | \
{g_v:.2f} s ({tokens / g_v:.1f} tok/s) | **{g_v / g_t:.2f}x** |
| full judge pass (5 pointwise + 240 pairwise prompts) | {j_t:.1f} s | {j_v:.1f} s | \
**{j_v / j_t:.2f}x** |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--vllm", action="store_true", help="vLLM against transformers")
    parser.add_argument("--vllm-url", default=os.environ.get("PSYEVO_VLLM_URL", ""))
    args = parser.parse_args()
    if args.vllm:
        body = _with_vllm(args)
        section = "backend (vllm vs transformers)"
    else:
        body = asyncio.run(run(args.model, args.reps, args.max_new_tokens, args.threads))
        section = f"backend ({args.model})"
    print(body)
    write_section(section, body)


def _with_vllm(args: argparse.Namespace) -> str:
    if args.vllm_url:
        return asyncio.run(run_vllm(args.vllm_url, args.reps, args.max_new_tokens, args.threads))
    from counselor_engine.models import ensure_default_model
    from counselor_engine.tests.vllm_server import started_server

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "bin-vllm.log"
        with started_server(log, ensure_default_model()) as url:
            return asyncio.run(run_vllm(url, args.reps, args.max_new_tokens, args.threads))


if __name__ == "__main__":
    main()
