"""Measuring the crisis detector on the labelled files in ``counselor_engine/tests/data``.

Which splits are held out (never trained on), and per-split figures in the shape
docs/reliability.md and the benches read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from counselor_engine.safety.assessment import RANK

EVAL_DIR = Path(__file__).resolve().parents[1] / "tests" / "data"
# Splits never trained on, per labelled file: their figures are the honest ones. Each round
# from v2-r6 on was written by someone who never saw our data or code, after the change it
# measures, and appended to crisis_eval_v2.jsonl when first scored, then trained on:
# v2-r6..v2-r9 from round 8, v2-r10..v2-r13 from round 9, v2-r14 and v2-r15 from round 10;
# v2-r16 and v2-r17 measure round 10 (``counselor_engine.safety.tuned_model``). A split not yet
# appended is empty, and every reader here tolerates that.
# ``heldout`` is the older set's untuned split.
HELD_OUT: dict[str, tuple[str, ...]] = {
    "crisis_eval_v2.jsonl": ("v2-r16", "v2-r17"),
    "crisis_eval.jsonl": ("heldout",),
}


def labelled(name: str, splits: Sequence[str] | None = None) -> list[dict[str, str]]:
    """Rows of a labelled file in ``tests/data`` (optionally only some splits)."""
    rows = [json.loads(line) for line in (EVAL_DIR / name).read_text("utf-8").splitlines() if line]
    return [r for r in rows if splits is None or r["split"] in splits]


def figures(
    rows: Sequence[dict[str, str]], assess: Callable[[str], object]
) -> dict[str, list[int]]:
    """Counts [hits, total] per kind of positive; ``flagged`` (any level on a positive) and
    ``fp`` (negatives flagged at concern or crisis). A positive is recalled when the
    assessed level is at least its label. Machine-readable for docs/reliability.md."""
    out: dict[str, list[int]] = {}
    for row in rows:
        got = assess(row["text"]).level  # type: ignore[attr-defined]
        if row["level"] == "none":
            keys = [("fp", got != "none")]
        else:
            keys = [(row["kind"], RANK[got] >= RANK[row["level"]]), ("flagged", got != "none")]
        for key, hit in keys:
            cell = out.setdefault(key, [0, 0])
            cell[0] += int(hit)
            cell[1] += 1
    return out


def figures_by_split(
    rows: Sequence[dict[str, str]], assess: Callable[[str], object]
) -> dict[str, dict[str, list[int]]]:
    """:func:`figures` per split, so a held-out round is never pooled with trained ones."""
    splits: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        splits.setdefault(row["split"], []).append(row)
    return {split: figures(part, assess) for split, part in splits.items()}


def held_out_figures(assess: Callable[[str], object]) -> dict[str, dict[str, list[int]]]:
    """Figures of every :data:`HELD_OUT` split, keyed ``"<file>:<split>"``; a split with no
    rows yet (a round not written or not appended) maps to ``{}``, never to a made-up 0/0."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, splits in HELD_OUT.items():
        per = figures_by_split(labelled(name, splits), assess)
        for split in splits:
            out[f"{name}:{split}"] = per.get(split, {})
    return out
