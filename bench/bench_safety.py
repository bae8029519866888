"""Safety benchmark: crisis-eval figures per split, and the latency of ``safety.assess``.

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


def _median_ms(text: str, repeats: int) -> float:
    safety.assess(text)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        safety.assess(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    rows = [json.loads(line) for line in (DATA / "crisis_eval.jsonl").read_text().splitlines()]
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rows:
        got = safety.assess(row["text"]).level
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
            safety.assess(text)
    per_message = (time.perf_counter() - start) / (3 * len(typical)) * 1000
    hard = " ".join(r["text"] + "." for r in rows if r["level"] == "none")[:2048]
    venting = (VENTING * 5)[:2048]
    body = (
        "Recall counts a positive when the assessed level is at least its label; rounds 1-4 "
        "were scored once before being used to fix rules (first-run figures are in "
        "counselor_engine/tests/test_safety.py), `heldout` is not tuned against.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + f"- assess, labelled statements (mean of {len(typical)}): {per_message:.3f} ms\n"
        + f"- assess, 2 KB venting message (median): {_median_ms(venting, 50):.2f} ms\n"
        + f"- assess, 2 KB of hard negatives (median): {_median_ms(hard, 50):.2f} ms\n"
        + "- target: < 1 ms per 2 KB message"
    )
    print(body)
    write_section("safety", body)


if __name__ == "__main__":
    main()
