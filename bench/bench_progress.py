"""What the chat page's progress costs: one judge pass in one pairwise call vs with progress.

Run: ``.venv/bin/python -m bench.bench_progress [--model auto|smollm2|tiny|PATH] [--reps 3]``.

With ``on_progress`` the judge sends its 240 pairwise prompts (N = 5) in five calls, one
per candidate shown as A, so the page can say how many comparisons are done; the
conversation prefix is then computed five times instead of once (judge.py). Both arms
judge the same context and candidates as ``bench.bench_judge``, on the shared-prefix
path, repetitions interleaved and alternating which arm goes first, so drift in machine
load hits both; we report medians and their ratio, and check that the two arms read the
same supports. Figures go to bench/RESULTS.md (section "judge progress (<model>)").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench._results import write_section
from bench.bench_judge import CANDIDATES, CONTEXT, _load, _model_path
from counselor_engine.backends.transformers_backend import TransformersBackend
from counselor_engine.judge import GroupJudgment, Judge


async def one_pass(judge: Judge, progress: bool) -> tuple[float, GroupJudgment]:
    steps: list[tuple[int, int]] = []
    start = time.perf_counter()
    judged = await judge.judge_group(
        CONTEXT, CANDIDATES, on_progress=(lambda d, t: steps.append((d, t))) if progress else None
    )
    seconds = time.perf_counter() - start
    if progress:
        assert steps[-1] == (20, 20), steps
    return seconds, judged


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name, path = _model_path(args.model, Path(tmp))
        backend = TransformersBackend(str(path))
        judge = Judge(backend)
        await one_pass(judge, False)  # warm-up: weights paged in, kernels chosen
        times: dict[bool, list[float]] = {False: [], True: []}
        judged: dict[bool, GroupJudgment] = {}
        for rep in range(args.reps):
            for progress in (False, True) if rep % 2 == 0 else (True, False):
                seconds, judged[progress] = await one_pass(judge, progress)
                times[progress].append(seconds)
    one, chunked = (statistics.median(times[k]) for k in (False, True))
    diff = max(
        abs(a - b)
        for key in judged[False].support
        for a, b in zip(judged[False].support[key], judged[True].support[key], strict=True)
    )
    body = "\n".join(
        [
            f"Model {name}; {args.reps} interleaved repetitions; load {_load()}.",
            "",
            "| arm | median s | ratio |",
            "|---|---|---|",
            f"| one pairwise call (no progress) | {one:.2f} | 1.00 |",
            f"| one call per candidate as A (progress) | {chunked:.2f} | {chunked / one:.2f} |",
            "",
            f"Largest difference between the arms' supports: {diff:.2e}.",
        ]
    )
    print(body)
    write_section(f"judge progress ({name})", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="auto")
    parser.add_argument("--reps", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
