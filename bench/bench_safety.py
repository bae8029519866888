"""Safety benchmark: crisis-eval figures per split, and the latency of ``safety.assess``.

Two tables: the rule layer on ``crisis_eval.jsonl`` (as before), and rules alone vs rules +
the crisis model (``safety.crisis_model``) on ``crisis_eval_v2.jsonl`` and the old held-out split.
Latency is reported for the rules alone, the model alone, and the full ``assess``, with
the model's one-off load (the MiniLM encoder) timed separately.

Run: ``.venv/bin/python -m bench.bench_safety``.

Latency is the median of repeated calls on: the labelled statements (typical chat
messages), a realistic 2 KB venting message with no risk in it, and 2 KB made of hard
negatives (idioms, negations, media), the worst case for rule gating. The target in the
issue is < 1 ms per 2 KB message. Figures go to bench/RESULTS.md (section "safety").
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from bench._results import write_section
from counselor_engine import safety
from counselor_engine.safety import evaluation, registry

DATA = Path(__file__).resolve().parents[1] / "counselor_engine" / "tests" / "data"
RANK = {"none": 0, "concern": 1, "crisis": 2}
VENTING = (
    "So today was another long day at work. My manager keeps piling things on me and I feel "
    "like I can never catch up, and when I get home I just lie on the sofa scrolling and "
    "feeling guilty that I'm not doing more. My partner tries to help but I end up snapping "
    "at them and then I feel worse. I haven't been sleeping well either, I wake up at 4am and "
    "my mind races about everything I didn't finish. I know I should exercise and eat better "
    "but I just don't have the energy. "
)


def _median_ms(text: str, repeats: int, fn=safety.rules_assess) -> float:  # type: ignore[no-untyped-def]
    fn(text)
    times = []
    for i in range(repeats):
        probe = f"{text} {i}"  # defeat the verdict cache: every call is a new message
        start = time.perf_counter()
        fn(probe)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _cell(fig: dict[str, list[int]], key: str) -> str:
    hit, total = fig.get(key, [0, 0])
    return f"{hit}/{total}"


def _model_section(venting: str, hard: str) -> str:
    start = time.perf_counter()
    registry.reset()
    model = registry.get_model()
    registry.warm()
    load_s = time.perf_counter() - start
    kinds = ["explicit", "indirect", "misspelled", "intermediate", "flagged", "fp"]
    lines = ["| split | layers | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 2) + "|"]
    v2 = sorted({r["split"] for r in evaluation.labelled("crisis_eval_v2.jsonl")})
    sets = [("crisis_eval_v2.jsonl", s) for s in v2] + [("crisis_eval.jsonl", "heldout")]
    held = [s for splits in evaluation.HELD_OUT.values() for s in splits]
    for name, split in sets:
        rows = evaluation.labelled(name, [split])
        for label, fn in (("rules", safety.rules_assess), ("rules + model", safety.assess)):
            fig = evaluation.figures(rows, fn)
            lines.append(
                f"| {split} | {label} | " + " | ".join(_cell(fig, k) for k in kinds) + " |"
            )
    encoder = model.encoder if model else "none"
    short = "my week has been long and i feel flat"  # no rule fires: the model runs
    return (
        f"Crisis model: encoder `{encoder}`, thresholds {model.thresholds if model else '-'}; "
        f"held out (never trained on): {', '.join(held)}; the other splits are in-sample. "
        "First-run "
        "figures of each round are in counselor_engine/tests/test_safety_model.py.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + f"- model load + warm-up (once per process): {load_s:.2f} s\n"
        + f"- full assess, short message (median): {_median_ms(short, 30, safety.assess):.2f} ms\n"
        + f"- full assess, 2 KB venting message (median): {_median_ms(venting, 20, safety.assess):.2f} ms\n"
        + f"- full assess, 2 KB of hard negatives (median): {_median_ms(hard, 20, safety.assess):.2f} ms\n"
        + f"- rules alone, short message (median): {_median_ms(short, 30):.3f} ms"
    )


def main() -> None:
    rows = [json.loads(line) for line in (DATA / "crisis_eval.jsonl").read_text().splitlines()]
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rows:
        got = safety.rules_assess(row["text"]).level
        key = "false positives" if row["level"] == "none" else row["kind"]
        hit = got != "none" if row["level"] == "none" else RANK[got] >= RANK[row["level"]]
        table[row["split"]][key][0] += hit
        table[row["split"]][key][1] += 1
    kinds = ["explicit", "indirect", "misspelled", "intermediate", "false positives"]
    lines = ["| split | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for split in ["dev", "round1", "round2", "round3", "round4", "heldout"]:
        cells = [f"{table[split][k][0]}/{table[split][k][1]}" for k in kinds]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")

    typical = [r["text"] for r in rows]
    start = time.perf_counter()
    for _ in range(3):
        for text in typical:
            safety.rules_assess(text)
    per_message = (time.perf_counter() - start) / (3 * len(typical)) * 1000
    hard = " ".join(r["text"] + "." for r in rows if r["level"] == "none")[:2048]
    venting = (VENTING * 5)[:2048]
    body = (
        "Rule layer alone (`safety.rules_assess`). Recall counts a positive when the "
        "assessed level is at least its label; rounds 1-4 "
        "were scored once before being used to fix rules (first-run figures are in "
        "counselor_engine/tests/test_safety.py), `heldout` is not tuned against.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + f"- assess, labelled statements (mean of {len(typical)}): {per_message:.3f} ms\n"
        + f"- assess, 2 KB venting message (median): {_median_ms(venting, 50):.2f} ms\n"
        + f"- assess, 2 KB of hard negatives (median): {_median_ms(hard, 50):.2f} ms\n"
        + "- target: < 1 ms per 2 KB message (rules)\n\n"
        + _model_section(venting, hard)
    )
    print(body)
    write_section("safety", body)


if __name__ == "__main__":
    main()
