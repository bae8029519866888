"""Measuring an evaluator on the judge sanity set: coverage and accuracy at the floor.

The sanity set (``bench/data/judge_sanity.json``, written by this project) holds
(context, better reply, worse reply) triples where one reply is clearly better by the
judge's own criteria. For one evaluator, each triple becomes a two-candidate group
(better = candidate 0) judged in both orders on every criterion; then, exactly as a
counselor turn does:

- overall: Eq. 12 supports (binary votes) -> Eq. 7 with the 0.1 floor
  (:func:`counselor_engine.soca.build_preference_graph`). *Coverage* is the share of
  triples with an edge; *accuracy* the share of those edges that point to the better
  reply.
- per criterion: the criterion alone, read the same way (its forward and backward votes
  must favour the same reply: a one-criterion Eq. 12 share is 0 or 1, so the floor never
  binds). Coverage and accuracy as above.

Pure functions over stored readings, so the benchmark scores each reply once and
derives every variant (position bias removed or not) without asking the model again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from counselor_engine import soca
from counselor_engine.judge import JudgeContext, PairJudgment, pair_support


@dataclass(frozen=True)
class Triple:
    context_id: str
    kind: str  # what is wrong with the worse reply (off_topic, dismissive, ...)
    context: JudgeContext
    better: str
    worse: str


def load_sanity_set(path: Path | str, split: str) -> list[Triple]:
    """The triples of one split ("test" or "dev"), in file order."""
    data = json.loads(Path(path).read_text())
    if split not in ("test", "dev"):
        raise ValueError(f"split: expected 'test' or 'dev', got {split!r}")
    triples = []
    for c in data[split]:
        ctx = JudgeContext((), c["client_message"], c["skill"])
        for kind, worse in c["worse"].items():
            triples.append(Triple(c["id"], kind, ctx, c["better"], worse))
    return triples


@dataclass
class Tally:
    """Pairs seen, edges formed and edges pointing to the better reply."""

    pairs: int = 0
    edges: int = 0
    correct: int = 0

    def add(self, edge_to_better: bool | None) -> None:
        self.pairs += 1
        if edge_to_better is not None:
            self.edges += 1
            self.correct += int(edge_to_better)

    @property
    def coverage(self) -> float:
        return self.edges / self.pairs if self.pairs else 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.edges if self.edges else 0.0


@dataclass
class SanityScore:
    overall: Tally = field(default_factory=Tally)
    by_criterion: dict[str, Tally] = field(default_factory=dict)
    by_kind: dict[str, Tally] = field(default_factory=dict)


def overall_edge(
    judgments: Sequence[PairJudgment], weights: Sequence[float], *, floor: float = soca.FLOOR
) -> bool | None:
    """For a two-candidate group (0 = better): True if the admitted edge says 0 > 1,
    False if it says 1 > 0, None when Eq. 7 at ``floor`` admits none."""
    support = pair_support(judgments, weights)
    edges = soca.build_preference_graph(2, support, floor=floor)
    return None if not edges else edges[0].winner == 0


def criterion_edge(forward: PairJudgment, backward: PairJudgment) -> bool | None:
    """One criterion's two-order verdict: True/False when both votes favour candidate 0
    / candidate 1, None when they disagree or either is a tie."""
    if forward.vote is None or backward.vote is None or forward.vote != backward.vote:
        return None
    return forward.vote == 1.0


def score(
    groups: Sequence[tuple[Triple, Sequence[PairJudgment]]],
    weights: Mapping[str, float],
    *,
    floor: float = soca.FLOOR,
) -> SanityScore:
    """Coverage and accuracy over judged triples (judgments in ``Judge.judge_group``'s
    layout for two candidates: the forward criteria, then the backward ones)."""
    result = SanityScore()
    ids = list(weights)
    w = [weights[c] for c in ids]
    for triple, judgments in groups:
        if [jd.criterion for jd in judgments] != ids + ids:
            raise ValueError("judgments: expected forward then backward, one per criterion")
        verdict = overall_edge(judgments, w, floor=floor)
        result.overall.add(verdict)
        result.by_kind.setdefault(triple.kind, Tally()).add(verdict)
        per = len(ids)
        for k, cid in enumerate(ids):
            result.by_criterion.setdefault(cid, Tally()).add(
                criterion_edge(judgments[k], judgments[per + k])
            )
    return result
