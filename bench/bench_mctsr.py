"""MCTSr-Zero vs plain sampling: backend calls and wall time per counselor turn.

Run: ``.venv/bin/python -m bench.bench_mctsr [--model auto|smollm2|tiny] [--turns 4]
[--n 3] [--max-calls 12] [--tokens 24]``.

Both strategies answer the same client messages on the same backend in this process, in
graph mode with the same N; turns alternate which strategy goes first, so drift in machine
load hits both. Reported per strategy: median wall time per turn, backend calls per turn
(search + judge), and for mctsr the search's own calls, tree size and best Q; then the
mctsr / sample ratios. Figures go to bench/RESULTS.md (section "mctsr (<model>)").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench._results import write_section
from bench.bench_engine import MESSAGES, TimedBackend, model_path
from counselor_engine.backends.base import GenerationParams
from counselor_engine.counselor import ClientState, Counselor, CounselorConfig, DoneEvent
from counselor_engine.mctsr import MctsrConfig
from counselor_engine.memory import MemoryStore


class CountingBackend(TimedBackend):
    """TimedBackend that also counts calls (graph mode makes no streaming calls)."""

    calls = 0

    async def _timed(self, awaitable: Any, kind: str) -> Any:
        self.calls += 1
        return await super()._timed(awaitable, kind)


async def one_turn(backend: CountingBackend, config: CounselorConfig, k: int) -> dict[str, Any]:
    client = ClientState(f"bench-{k}", "cbt", 0, 4, memory=MemoryStore())
    counselor = Counselor(backend, config=config)  # type: ignore[arg-type]
    counselor.start_session(client, None)
    backend.calls = 0
    start = time.perf_counter()
    done = None
    async for event in counselor.respond(MESSAGES[k % len(MESSAGES)]):
        if isinstance(event, DoneEvent):
            done = event
    wall = time.perf_counter() - start
    if done is None or done.group is None:
        raise SystemExit(f"turn {k} did not complete")
    search = done.group.search or {}
    return {
        "wall": wall,
        "calls": backend.calls,
        "search_calls": search.get("calls_used", 0),
        "nodes": search.get("node_count", config.n_candidates),
        "best_q": max(search.get("q_values", [float("nan")])),
    }


async def main_async(args: argparse.Namespace) -> None:
    from counselor_engine.backends.transformers_backend import TransformersBackend

    name, path = model_path(args.model)
    backend = CountingBackend(TransformersBackend(path))
    params = GenerationParams(max_new_tokens=args.tokens, temperature=0.9, top_p=0.95)
    configs = {
        "sample": CounselorConfig(n_candidates=args.n, generation=params, seed=1),
        "mctsr": CounselorConfig(
            n_candidates=args.n, generation=params, seed=1, candidate_strategy="mctsr",
            mctsr=MctsrConfig(max_calls=args.max_calls),
        ),
    }  # fmt: skip
    await one_turn(backend, configs["sample"], 0)  # warm-up (model load, first forward)
    rows: dict[str, list[dict[str, Any]]] = {"sample": [], "mctsr": []}
    for k in range(args.turns):
        order = ("sample", "mctsr") if k % 2 == 0 else ("mctsr", "sample")
        for strategy in order:
            rows[strategy].append(await one_turn(backend, configs[strategy], k))

    def med(strategy: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[strategy])

    lines = [
        f"Model: {name}; {args.turns} turns per strategy, N = {args.n}, {args.tokens} new "
        f"tokens, graph mode; mctsr max_calls = {args.max_calls}, c = 2.8, 2 views.",
        "",
        "| strategy | median s/turn | median backend calls/turn | search calls | nodes | best Q |",
        "|---|---|---|---|---|---|",
    ]
    for strategy in ("sample", "mctsr"):
        q = med(strategy, "best_q") if strategy == "mctsr" else float("nan")
        lines.append(
            f"| {strategy} | {med(strategy, 'wall'):.2f} | {med(strategy, 'calls'):.0f} | "
            f"{med(strategy, 'search_calls'):.0f} | {med(strategy, 'nodes'):.0f} | "
            + ("-" if strategy == "sample" else f"{q:.2f}")
            + " |"
        )
    lines += [
        "",
        f"Ratio mctsr / sample: time {med('mctsr', 'wall') / med('sample', 'wall'):.2f}x, "
        f"backend calls {med('mctsr', 'calls') / med('sample', 'calls'):.2f}x.",
    ]
    body = "\n".join(lines)
    print(body)
    write_section(f"mctsr ({name})", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="auto | smollm2 | tiny")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-calls", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=24)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
