"""The internal judge: two-order pairwise support, pointwise scores and turn outcomes.

Every judgment is read from next-token probabilities (P("A") vs P("B"); P("1".."5")),
never parsed from free text, so a judgment is a number even when the model rambles.

1. Pairwise (paper Eq. 12): for each unordered pair {i, j}, each presentation order and
   each of the twelve criteria, the backend gives P(A) and P(B). Mapped back to candidate
   identity, each criterion casts a binary vote z (the side with the higher probability;
   an exact tie is no vote), and the support share p_ij^o is the weighted share of the
   votes that favour i (:func:`counselor_engine.soca.vote_share`): ``votes="binary"``, the
   default and the paper's definition. ``votes="soft"`` averages the probabilities
   themselves (:func:`counselor_engine.soca.support_share`); it is kept as a named
   setting (``PSYEVO_JUDGE_VOTES=soft``) only to measure what it changes (bench_judge):
   a small judge's P(A) sits near 0.5 on every criterion, so soft shares shrink c_ij
   toward 0 and fewer edges clear the 0.1 floor. All prompts of a group go to the backend
   in ONE batched call, unless the caller asks for progress: then one call per reply
   shown as A (its prompts share the context and reply A, so prefix sharing keeps most
   of its gain), and after each the caller hears how many of the N(N-1) ordered
   comparisons are done. A person waiting tens of seconds for a judged reply on a small
   CPU sees real progress instead of a silent page (the context prefix is then computed
   N times instead of once: 1.14x the judge's time, bench/bench_progress.py).
2. Pointwise: the expectation of the 1-5 digit distribution, per candidate (one call).
3. Turn outcome R_t in [0, 1]: after the client's next message, four aspects (emotional
   change, willingness to disclose, collaboration, concrete progress) each rated 1-5;
   R_t is the mean of (E[rating] - 1) / 4.

Choice (paper silent): a probability that is NaN or infinite makes the whole group
inadmissible (``GroupJudgment.admissible`` is False): the SOCA graph is not built from
it, and delivery falls back to the pointwise scores when those are finite, else to
candidate 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from pathlib import Path

from counselor_engine.backends.base import Backend, ChatMessage
from counselor_engine.soca import VOTES, criterion_vote, support_share, vote_share

PROMPTS = Path(__file__).with_name("prompts")
# Told (done, total) ordered comparisons: once with 0 before the first, then after each
# reply shown as A has been compared with every other.
ProgressCallback = Callable[[int, int], None]
OUTCOME_ASPECTS = {
    "emotional_change": "Did the client's emotional state improve after the reply?",
    "disclosure": "Was the client more willing to share thoughts and feelings?",
    "collaboration": "Did the client engage with the counselor as a partner?",
    "progress": "Did the client move toward something concrete (an insight, a plan, a step)?",
}
DIGITS = ("1", "2", "3", "4", "5")


@dataclass(frozen=True)
class Criterion:
    id: str
    weight: float
    question: str


@cache
def default_criteria() -> tuple[Criterion, ...]:
    data = json.loads((PROMPTS / "judge_criteria.json").read_text())
    return tuple(Criterion(c["id"], float(c["weight"]), c["question"]) for c in data["criteria"])


@cache
def _prompt(name: str) -> str:
    return (PROMPTS / f"{name}.txt").read_text().strip()


@dataclass(frozen=True)
class JudgeContext:
    """What the judge sees of the conversation: recent turns, the client's message, the
    skill the counselor was asked to use."""

    history: tuple[tuple[str, str], ...]  # (speaker, text), oldest first; speaker client|counselor
    client_message: str
    skill_name: str
    skill_instruction: str = ""


@dataclass
class PairJudgment:
    """One (pair, order, criterion) reading, kept for the clinician's 'why' view."""

    i: int
    j: int
    order: str  # "forward": i shown as A; "backward": j shown as A
    criterion: str
    p_a: float
    z_i: float  # P(candidate i preferred) in this order
    vote: float | None = None  # binary z: 1.0 favours i, 0.0 favours j, None a tie

    def to_dict(self) -> dict[str, object]:
        return {
            "i": self.i,
            "j": self.j,
            "order": self.order,
            "criterion": self.criterion,
            "p_a": self.p_a,
            "z_i": self.z_i,
            "vote": self.vote,
        }


@dataclass
class GroupJudgment:
    support: dict[tuple[int, int], tuple[float, float]]
    pointwise: list[float]
    judgments: list[PairJudgment] = field(default_factory=list)
    admissible: bool = True
    problem: str = ""


def pair_support(
    judgments: Sequence[PairJudgment], weights: Sequence[float], *, votes: str = "binary"
) -> dict[tuple[int, int], tuple[float, float]]:
    """Eq. 12 per pair and order from stored readings: ``(p_forward, p_backward)``.

    ``judgments`` come in :meth:`Judge.judge_group`'s layout (per pair: the forward
    criteria, then the backward ones). Pure, so the benchmark can compare both vote
    rules on the same judged groups without asking the model again.
    """
    if votes not in VOTES:
        raise ValueError(f"votes: expected one of {', '.join(VOTES)}, got {votes!r}")
    per = len(weights)
    if per == 0 or len(judgments) % (2 * per):
        raise ValueError("judgments: expected whole (pair, two orders x criteria) blocks")
    support: dict[tuple[int, int], tuple[float, float]] = {}
    for index in range(0, len(judgments), 2 * per):
        fwd = judgments[index : index + per]
        bwd = judgments[index + per : index + 2 * per]
        if votes == "binary":
            shares = (
                vote_share([jd.vote for jd in fwd], weights),
                vote_share([jd.vote for jd in bwd], weights),
            )
        else:
            shares = (
                support_share([jd.z_i for jd in fwd], weights),
                support_share([jd.z_i for jd in bwd], weights),
            )
        support[(fwd[0].i, fwd[0].j)] = shares
    return support


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _render_context(context: JudgeContext, max_chars: int) -> str:
    lines = [f"{speaker.capitalize()}: {text}" for speaker, text in context.history]
    lines.append(f"Client: {context.client_message}")
    convo = "\n".join(lines)
    if len(convo) > max_chars:
        convo = "…" + convo[-max_chars:]
    skill = context.skill_name + (
        f" ({context.skill_instruction})" if context.skill_instruction else ""
    )
    return f"<conversation>\n{convo}\n</conversation>\nSelected skill: {skill}"


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "…"


class Judge:
    """Batched, probability-reading judge over any :class:`Backend`.

    The judge always runs on the base model (``adapter=None``): the adapter being trained
    must not grade its own outputs.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        criteria: Sequence[Criterion] | None = None,
        context_chars: int = 1200,
        response_chars: int = 800,
        votes: str = "binary",
    ) -> None:
        if votes not in VOTES:
            raise ValueError(f"votes: expected one of {', '.join(VOTES)}, got {votes!r}")
        self.votes = votes
        self.backend = backend
        self.criteria = tuple(criteria) if criteria is not None else default_criteria()
        if not self.criteria:
            raise ValueError("criteria: at least one criterion is needed")
        if any(not (c.weight > 0 and math.isfinite(c.weight)) for c in self.criteria):
            raise ValueError("criteria: weights must be positive and finite")
        self.context_chars = context_chars
        self.response_chars = response_chars

    # -- prompts ---------------------------------------------------------------------------
    def _pair_prompt(self, ctx: str, a: str, b: str, criterion: Criterion) -> list[ChatMessage]:
        body = (
            f"{ctx}\n\n<reply_A>\n{_clip(a, self.response_chars)}\n</reply_A>\n"
            f"<reply_B>\n{_clip(b, self.response_chars)}\n</reply_B>\n\n"
            f"Criterion: {criterion.question}\nAnswer A or B."
        )
        return [ChatMessage("system", _prompt("judge_pairwise")), ChatMessage("user", body)]

    def _point_prompt(self, ctx: str, reply: str) -> list[ChatMessage]:
        body = f"{ctx}\n\n<reply>\n{_clip(reply, self.response_chars)}\n</reply>\n\nRate 1-5."
        return [ChatMessage("system", _prompt("judge_pointwise")), ChatMessage("user", body)]

    # -- judgments -------------------------------------------------------------------------
    async def judge_group(
        self,
        context: JudgeContext,
        candidates: Sequence[str],
        *,
        on_progress: ProgressCallback | None = None,
    ) -> GroupJudgment:
        """Pairwise support for every pair in both orders, plus pointwise scores."""
        n = len(candidates)
        if n == 0:
            raise ValueError("candidates: empty group")
        ctx = _render_context(context, self.context_chars)
        pointwise = await self.pointwise(ctx, candidates)
        if n == 1:
            return GroupJudgment(
                support={},
                pointwise=pointwise,
                admissible=False,
                problem="a single candidate has no pairs",
            )
        keys: list[tuple[int, int, str, Criterion]] = []
        prompts: list[list[ChatMessage]] = []
        for i, j in combinations(range(n), 2):
            for order, (a, b) in (("forward", (i, j)), ("backward", (j, i))):
                for criterion in self.criteria:
                    keys.append((i, j, order, criterion))
                    prompts.append(self._pair_prompt(ctx, candidates[a], candidates[b], criterion))
        shown_as_a = [i if order == "forward" else j for i, j, order, _ in keys]
        probs = await self._pairwise(prompts, shown_as_a, n, on_progress)
        judgments: list[PairJudgment] = []
        for (i, j, order, criterion), (p_a, p_b) in zip(keys, probs, strict=True):
            z_i = p_a if order == "forward" else 1.0 - p_a
            vote = None
            if _finite([p_a, p_b]):
                p_i, p_j = (p_a, p_b) if order == "forward" else (p_b, p_a)
                vote = criterion_vote(float(p_i), float(p_j))
            judgments.append(PairJudgment(i, j, order, criterion.id, float(p_a), float(z_i), vote))
        if not _finite([float(p) for row in probs for p in row[:2]]):
            return GroupJudgment(
                support={},
                pointwise=pointwise,
                judgments=judgments,
                admissible=False,
                problem="non-finite pairwise probability",
            )
        weights = [c.weight for c in self.criteria]
        support = pair_support(judgments, weights, votes=self.votes)
        admissible = _finite(pointwise)
        return GroupJudgment(
            support=support,
            pointwise=pointwise,
            judgments=judgments,
            admissible=admissible,
            problem="" if admissible else "non-finite pointwise score",
        )

    async def _pairwise(
        self,
        prompts: list[list[ChatMessage]],
        shown_as_a: list[int],
        n: int,
        on_progress: ProgressCallback | None,
    ) -> list[list[float]]:
        """P(A), P(B) for every pairwise prompt, in input order: one batched call, or with
        ``on_progress`` one call per candidate shown as A (see the module docstring)."""
        if on_progress is None:
            return await self.backend.choice_probabilities(prompts, ("A", "B"))
        total = n * (n - 1)
        on_progress(0, total)
        probs: list[list[float]] = [[] for _ in prompts]
        for a in range(n):
            rows = [k for k, shown in enumerate(shown_as_a) if shown == a]
            chunk = await self.backend.choice_probabilities([prompts[k] for k in rows], ("A", "B"))
            for k, row in zip(rows, chunk, strict=True):
                probs[k] = row
            on_progress((a + 1) * (n - 1), total)
        return probs

    async def pointwise(self, ctx: str, candidates: Sequence[str]) -> list[float]:
        prompts = [self._point_prompt(ctx, c) for c in candidates]
        probs = await self.backend.choice_probabilities(prompts, DIGITS)
        return [_expected_digit(row) for row in probs]

    async def turn_outcome(self, counselor_reply: str, client_next: str) -> float:
        """R_t in [0, 1] from the client's reaction to the delivered reply."""
        return (await self.turn_outcomes([(counselor_reply, client_next)]))[0]

    async def turn_outcomes(self, exchanges: Sequence[tuple[str, str]]) -> list[float]:
        """R_t for many (counselor reply, client's next message) pairs in one batched call."""
        if not exchanges:
            return []
        prompts = []
        for reply, client_next in exchanges:
            if not client_next.strip():
                raise ValueError("client_next: empty message")
            for question in OUTCOME_ASPECTS.values():
                body = (
                    f"<counselor_reply>\n{_clip(reply, self.response_chars)}\n"
                    f"</counselor_reply>\n<client_next_message>\n"
                    f"{_clip(client_next, self.response_chars)}\n</client_next_message>\n\n"
                    f"Aspect: {question}\nRate 1-5."
                )
                prompts.append(
                    [ChatMessage("system", _prompt("judge_outcome")), ChatMessage("user", body)]
                )
        probs = await self.backend.choice_probabilities(prompts, DIGITS)
        ratings = [_expected_digit(row) for row in probs]
        if not _finite(ratings):
            raise ValueError("turn outcome: the judge returned a non-finite probability")
        per = len(OUTCOME_ASPECTS)
        return [
            sum((r - 1.0) / 4.0 for r in ratings[k : k + per]) / per
            for k in range(0, len(ratings), per)
        ]


def _expected_digit(row: Sequence[float]) -> float:
    """E[rating] over "1".."5"; NaN propagates so the caller can refuse the group."""
    total = sum(row)
    if not math.isfinite(total) or total <= 0:
        return math.nan
    return sum((k + 1) * p for k, p in enumerate(row)) / total
