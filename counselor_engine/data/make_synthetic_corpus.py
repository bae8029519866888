"""Write the synthetic skill-labelled corpus behind the shipped default prior table.

This is NOT PsychEval annotation and not clinical evidence. The PsyEvo paper initialises Q
from skill labels in the PsychEval corpus, which this project does not ship. Instead, each
skill here gets hand-set affinities (by this project) for the three counseling stages, the
three progress bins and some affect categories, and every one of the 5 x 54 states receives
about ``TURNS_PER_STATE`` labelled turns split in proportion to the product of those
affinities. The corpus is deterministic (no random numbers), so rerunning this script gives
the same file. Rebuild both files from the repository root with::

    python -m counselor_engine.data.make_synthetic_corpus \
        counselor_engine/data/synthetic_skill_corpus.jsonl
    python -m counselor_engine.skills build-prior \
        counselor_engine/data/synthetic_skill_corpus.jsonl \
        counselor_engine/data/prior_default.json \
        --note "$(python -m counselor_engine.data.make_synthetic_corpus --note)"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from counselor_engine.skills import MODALITIES, skills_for
from counselor_engine.states import AFFECTS, PROGRESS, STAGES

TURNS_PER_STATE = 10

NOTE = (
    "Synthetic default written by the PsyEvo Counselor project, NOT PsychEval annotation "
    "and not clinical evidence: built with build_prior (Eq. 10) from "
    "synthetic_skill_corpus.jsonl, which make_synthetic_corpus.py generates "
    "deterministically from hand-set stage, progress and affect affinities per skill "
    f"({TURNS_PER_STATE} labelled turns per state). Replace it with a table built from a "
    "real skill-labelled corpus when one is available."
)

# skill -> (stage weights formulation/core/consolidation, progress weights early/middle/late,
#           affect multipliers; affects not listed weigh 1)
Affinity = tuple[tuple[float, float, float], tuple[float, float, float], dict[str, float]]
AFFINITIES: dict[str, Affinity] = {
    "CBT1": ((3, 1, 1), (3, 1, 1), {}),
    "CBT2": ((2, 3, 1), (1, 2, 1), {"anxiety": 1.5, "sadness": 1.5, "guilt": 1.5}),
    "CBT3": ((1, 3, 1), (1, 2, 2), {"anxiety": 1.5, "guilt": 1.5, "sadness": 1.3, "anger": 1.3}),
    "CBT4": ((0.5, 2, 2), (1, 1, 2), {"anxiety": 1.5, "positive": 1.3}),
    "CBT5": ((3, 1, 0.5), (2, 2, 1), {"anxiety": 1.3, "calmness": 1.3}),
    "CBT6": ((1, 1, 3), (0.5, 1, 3), {"calmness": 1.5, "positive": 1.5}),
    "BT1": ((3, 1.5, 0.5), (2, 2, 1), {"anger": 1.3, "anxiety": 1.3}),
    "BT2": ((1, 3, 1.5), (1, 2, 2), {"sadness": 2.0}),
    "BT3": ((0.5, 3, 1.5), (1, 2, 1.5), {"anxiety": 2.0}),
    "BT4": ((1, 2, 1), (2, 1.5, 1), {"anxiety": 2.0, "anger": 1.5}),
    "BT5": ((2.5, 1.5, 1), (1, 1, 2), {}),
    "BT6": ((0.5, 1.5, 3), (0.5, 1, 3), {"positive": 1.5, "calmness": 1.5}),
    "HET1": ((3, 2, 1.5), (3, 2, 1), {"sadness": 1.5, "anger": 1.3, "guilt": 1.3}),
    "HET2": ((2, 2, 1), (2, 2, 1), {"guilt": 2.0, "sadness": 1.5}),
    "HET3": ((1, 3, 1), (1, 2, 1), {"anxiety": 1.5, "sadness": 1.3}),
    "HET4": ((1, 2.5, 2), (1, 2, 2), {"calmness": 1.5, "positive": 1.3}),
    "HET5": ((0.5, 2, 2.5), (1, 1.5, 2), {"guilt": 1.3, "calmness": 1.3}),
    "HET6": ((1, 2, 1.5), (1, 2, 1.5), {"anger": 1.5}),
    "PDT1": ((3, 1.5, 0.5), (3, 1.5, 1), {"calmness": 1.3}),
    "PDT2": ((1.5, 3, 1), (1, 2, 1.5), {"anger": 1.5, "sadness": 1.3}),
    "PDT3": ((1, 3, 1.5), (1, 2, 2), {"guilt": 1.5, "sadness": 1.3}),
    "PDT4": ((1, 2.5, 1), (1, 2, 1), {"anxiety": 1.5, "anger": 1.3}),
    "PDT5": ((1, 2, 1.5), (1, 1.5, 2), {"anger": 1.5}),
    "PDT6": ((0.5, 2, 2.5), (0.5, 1.5, 2.5), {"guilt": 1.3, "calmness": 1.3}),
    "PMT1": ((2, 2, 1), (2, 1.5, 1), {"sadness": 1.5, "anxiety": 1.3}),
    "PMT2": ((3, 1, 1), (2, 2, 1), {"sadness": 1.3, "positive": 1.3}),
    "PMT3": ((2, 2, 2), (1, 1.5, 2), {}),
    "PMT4": ((2, 2.5, 1), (1.5, 2, 1), {"anger": 1.5, "anxiety": 1.5, "guilt": 1.5}),
    "PMT5": ((0.5, 2.5, 2.5), (1, 2, 2), {"positive": 1.5}),
    "PMT6": ((1, 1.5, 3), (1, 1, 3), {"positive": 2.0, "calmness": 1.5}),
}


def _weight(skill: str, stage: int, progress: int, affect: str) -> float:
    stages, bins, affects = AFFINITIES[skill]
    return stages[stage] * bins[progress] * affects.get(affect, 1.0)


def corpus_lines() -> list[str]:
    """The corpus, one JSON object per labelled turn, in a fixed order."""
    lines: list[str] = []
    for modality in MODALITIES:
        skills = [s.id for s in skills_for(modality)]
        for i, stage in enumerate(STAGES):
            for j, progress in enumerate(PROGRESS):
                for affect in AFFECTS:
                    weights = [_weight(s, i, j, affect) for s in skills]
                    total = sum(weights)
                    for skill, w in zip(skills, weights, strict=True):
                        record = {
                            "modality": modality,
                            "stage": stage,
                            "progress": progress,
                            "affect": affect,
                            "skill": skill,
                        }
                        count = round(TURNS_PER_STATE * w / total)
                        lines += [json.dumps(record, separators=(",", ":"))] * count
    return lines


def main(argv: list[str]) -> int:
    if argv == ["--note"]:
        print(NOTE)
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    Path(argv[0]).write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
