"""Judge sanity benchmark: coverage and accuracy of each evaluator at the 0.1 floor.

Run: ``.venv/bin/python -m bench.bench_judge_sanity [--model PATH] [--split test]``.

On the judge sanity set (bench/data/judge_sanity.json: 150 test triples, 30 dev), with
the model the evaluator runs on:

- ``ab``: the A/B judge as it ships (``Judge.judge_group`` on the two replies, both
  orders, twelve criteria, binary Eq. 12 votes).
- ``ab_debiased``: the same readings with the judge's position bias removed: per
  criterion, the mean P(A) over the DEV split's readings in both orders (content
  cancels there, each reply is A as often as B) is shifted to 0.5 before the vote.
  Measured on dev, applied to test; never tuned on test.
- ``contrastive``: per criterion, the reply whose log-likelihood rises more under the
  criterion's "meets it" framing than under its "fails it" framing gets the vote
  (``Judge.criterion_scores``; each reply is scored once and every pair reuses it).

Every reading is cached in ``var/bench/judge_sanity_<model>.json.{ab,contrastive}.json``
(the CPU is shared and a full pass takes a long time; a rerun resumes; the two kinds can be
read by two processes at once, ``--only ab`` / ``--only contrastive``, and ``--only none``
scores what is cached). The table goes to bench/RESULTS.md,
section "judge sanity (<model>)"; the dev-measured position bias to
``counselor_engine/prompts/judge_position_bias.json`` with ``--write-bias``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench._results import write_section
from counselor_engine import soca
from counselor_engine.judge import (
    Judge,
    PairJudgment,
    ab_judgment,
    contrastive_judgments,
    default_criteria,
)
from counselor_engine.judge_eval import SanityScore, Triple, load_sanity_set, score

SANITY = Path(__file__).with_name("data") / "judge_sanity.json"
BIAS_FILE = (
    Path(__file__).resolve().parents[1]
    / "counselor_engine"
    / "prompts"
    / "judge_position_bias.json"
)
ORDERS = ("forward", "backward")


def _key(t: Triple) -> str:
    return f"{t.context_id}/{t.kind}"


class Cache:
    """Readings by evaluator, one file each (``<stem>.ab.json``, ``<stem>.contrastive.json``),
    so the two kinds of reading can be taken by two processes at once."""

    def __init__(self, stem: Path) -> None:
        self.stem = stem
        self.data: dict[str, Any] = {}
        for kind in ("ab", "contrastive"):
            path = self._path(kind)
            self.data[kind] = json.loads(path.read_text()) if path.exists() else {}

    def _path(self, kind: str) -> Path:
        return self.stem.with_name(f"{self.stem.name}.{kind}.json")

    def save(self, kind: str) -> None:
        path = self._path(kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data[kind]))
        os.replace(tmp, path)


async def read_ab(
    judge: Judge, triples: list[Triple], cache: Cache, budget_s: float = math.inf
) -> float:
    """P(A) for every (order, criterion) of each triple, in order, until ``budget_s``
    seconds of model time are spent; returns the seconds spent on new readings."""
    spent = 0.0
    for t in triples:
        if _key(t) in cache.data["ab"]:
            continue
        if spent >= budget_s:
            break
        start = time.perf_counter()
        group = await judge.judge_group(t.context, [t.better, t.worse])
        spent += time.perf_counter() - start
        cache.data["ab"][_key(t)] = [jd.p_a for jd in group.judgments]
        cache.save("ab")
    return spent


async def read_contrastive(judge: Judge, triples: list[Triple], cache: Cache) -> float:
    """Criterion scores of each distinct reply, once per context."""
    spent = 0.0
    by_context: dict[str, list[Triple]] = {}
    for t in triples:
        by_context.setdefault(t.context_id, []).append(t)
    for cid, group in by_context.items():
        store = cache.data["contrastive"].setdefault(cid, {})
        todo = [("better", group[0].better)] if "better" not in store else []
        todo += [(t.kind, t.worse) for t in group if t.kind not in store]
        if not todo:
            continue
        start = time.perf_counter()
        scores = await judge.criterion_scores(group[0].context, [text for _, text in todo])
        spent += time.perf_counter() - start
        for (name, _), row in zip(todo, scores, strict=True):
            store[name] = row
        cache.save("contrastive")
    return spent


def ab_groups(
    triples: list[Triple], cache: Cache, bias: dict[str, float] | None
) -> list[tuple[Triple, list[PairJudgment]]]:
    ids = [c.id for c in default_criteria()]
    out = []
    for t in triples:
        p = cache.data["ab"][_key(t)]
        labels = [(o, c) for o in ORDERS for c in ids]
        out.append(
            (
                t,
                [
                    ab_judgment(0, 1, o, c, pa, 1.0 - pa, bias=(bias or {}).get(c, 0.5))
                    for (o, c), pa in zip(labels, p, strict=True)
                ],
            )
        )
    return out


def contrastive_groups(
    triples: list[Triple], cache: Cache
) -> list[tuple[Triple, list[PairJudgment]]]:
    ids = [c.id for c in default_criteria()]
    out = []
    for t in triples:
        store = cache.data["contrastive"][t.context_id]
        out.append((t, contrastive_judgments(0, 1, store["better"], store[t.kind], ids)))
    return out


def position_bias(triples: list[Triple], cache: Cache) -> dict[str, float]:
    """Per criterion, the mean P(A) over both orders of every triple given."""
    ids = [c.id for c in default_criteria()]
    values: dict[str, list[float]] = {c: [] for c in ids}
    for t in triples:
        for k, pa in enumerate(cache.data["ab"][_key(t)]):
            values[ids[k % len(ids)]].append(pa)
    return {c: statistics.fmean(v) for c, v in values.items() if v}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def table(results: dict[str, SanityScore]) -> str:
    names = list(results)
    head = "| | " + " | ".join(f"{n} cov. | {n} acc." for n in names) + " |"
    sep = "|---|" + "---:|---:|" * len(names)
    rows = [head, sep]

    def row(label: str, tallies: list[Any]) -> str:
        cells = [f"{_pct(t.coverage)} | {_pct(t.accuracy) if t.edges else '-'}" for t in tallies]
        return f"| {label} | " + " | ".join(cells) + " |"

    rows.append(
        row("**overall (Eq. 12 + Eq. 7, floor 0.1)**", [r.overall for r in results.values()])
    )
    for cid in results[names[0]].by_criterion:
        rows.append(row(cid, [r.by_criterion[cid] for r in results.values()]))
    for kind in results[names[0]].by_kind:
        rows.append(row(f"worse reply: {kind}", [r.by_kind[kind] for r in results.values()]))
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model folder (default: the default model)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--write-bias", action="store_true")
    parser.add_argument(
        "--only",
        choices=("ab", "contrastive", "both", "none"),
        default="both",
        help="which readings to take (none: only score the cached ones)",
    )
    parser.add_argument(
        "--ab-budget-s", type=float, default=math.inf, help="model seconds for new A/B readings"
    )
    parser.add_argument(
        "--ab-dev-contexts", type=int, default=6, help="dev contexts the A/B bias is read on"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the model's arithmetic (bfloat16: the faster judge issue 23 measured; its "
        "readings are cached and reported apart)",
    )
    args = parser.parse_args()
    import torch

    from counselor_engine.backends.transformers_backend import TransformersBackend
    from counselor_engine.models import resolve_model_path

    path = Path(args.model) if args.model else resolve_model_path()
    model = path.name if args.dtype == "float32" else f"{path.name}, {args.dtype}"
    backend = TransformersBackend(
        model_path=str(path), num_threads=args.threads or None, dtype=getattr(torch, args.dtype)
    )
    stem = path.name if args.dtype == "float32" else f"{path.name}-{args.dtype}"
    cache = Cache(
        Path(os.environ.get("PSYEVO_DATA_DIR", "var")) / "bench" / f"judge_sanity_{stem}.json"
    )
    test, dev = load_sanity_set(SANITY, "test"), load_sanity_set(SANITY, "dev")
    seconds = {"ab": 0.0, "contrastive": 0.0}
    if args.only in ("contrastive", "both"):
        seconds["contrastive"] = await read_contrastive(
            Judge(backend, evaluator="contrastive"), dev + test, cache
        )
    dev_ids = list(dict.fromkeys(t.context_id for t in dev))[: args.ab_dev_contexts]
    if args.only in ("ab", "both"):
        seconds["ab"] = await read_ab(
            Judge(backend),
            [t for t in dev if t.context_id in dev_ids] + test,
            cache,
            args.ab_budget_s,
        )
    weights = {c.id: c.weight for c in default_criteria()}
    ab_test = [t for t in test if _key(t) in cache.data["ab"]]
    ab_dev = [t for t in dev if _key(t) in cache.data["ab"]]
    bias = position_bias(ab_dev, cache)

    def has_scores(t: Triple) -> bool:
        store = cache.data["contrastive"].get(t.context_id, {})
        return "better" in store and t.kind in store

    c_test = [t for t in test if has_scores(t)]
    c_dev = [t for t in dev if has_scores(t)]
    results = {
        "ab": score(ab_groups(ab_test, cache, None), weights, floor=soca.FLOOR),
        "ab_debiased": score(ab_groups(ab_test, cache, bias), weights, floor=soca.FLOOR),
        "contrastive": score(contrastive_groups(c_test, cache), weights, floor=soca.FLOOR),
    }
    dev_results = {
        "ab": score(ab_groups(ab_dev, cache, None), weights),
        "ab_debiased": score(ab_groups(ab_dev, cache, bias), weights),
        "contrastive": score(contrastive_groups(c_dev, cache), weights),
    }
    if args.write_bias:
        if args.dtype != "float32" or len(bias) != len(weights):
            parser.error("--write-bias needs float32 A/B readings on every criterion")
        stored = json.loads(BIAS_FILE.read_text()) if BIAS_FILE.exists() else {}
        stored[model] = {c: round(b, 6) for c, b in bias.items()}
        BIAS_FILE.write_text(json.dumps(stored, indent=2) + "\n")
    all_pa = [p for v in cache.data["ab"].values() for p in v]
    if not all_pa:  # e.g. a bfloat16 run: only the contrastive evaluator was read
        results = {"contrastive": results["contrastive"]}
        dev_results = {"contrastive": dev_results["contrastive"]}
    body = (
        f"Sanity set: {len(test)} test triples ({len(test) // 5} contexts x 5 kinds of worse "
        f"reply), {len(dev)} dev triples. "
        + (
            f"The A/B readings cost about 40 s a triple on this shared CPU, so they were taken "
            f"on {len(ab_test)} test triples (the first {len(ab_test) // 5} contexts, all five "
            f"kinds each) and {len(ab_dev)} dev triples (the position bias is measured on "
            "those only); the contrastive evaluator on "
            if all_pa
            else "Readings of the contrastive evaluator alone, on "
        )
        + f"{len(c_test)} test and {len(c_dev)} dev triples. Model "
        f"`{model}`. Coverage = share of triples with an order-consistent edge at the 0.1 floor; "
        "accuracy = share of edges pointing to the better reply (per criterion: both orders' "
        "votes agree). "
        + (
            f"Readings: mean P(A) over all A/B readings {statistics.fmean(all_pa):.3f}; "
            "dev-measured bias per criterion " + ", ".join(f"{c} {b:.3f}" for c, b in bias.items())
            if all_pa
            else "No A/B readings were taken with this model"
        )
        + ".\n\n"
        + table(results)
        + "\n\nDev split, overall: "
        + ", ".join(
            f"{n} coverage {_pct(r.overall.coverage)} accuracy "
            f"{_pct(r.overall.accuracy) if r.overall.edges else '-'}"
            for n, r in dev_results.items()
        )
        + ".\n\nModel time for readings taken in this run (cached readings cost nothing): "
        + ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items())
        + "."
    )
    write_section(f"judge sanity ({model})", body)
    print(body)


if __name__ == "__main__":
    asyncio.run(main())
