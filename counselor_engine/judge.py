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
   How each criterion's z is obtained is the ``evaluator`` setting (Eq. 12, Eq. 7 and
   the floor are the same for all three): ``ab`` is the paper's A/B question above;
   ``ab_debiased`` reads the same A/B probabilities but first removes the judge's
   measured position bias (:func:`ab_judgment`); ``contrastive`` asks no A/B question:
   criterion l votes for the reply whose per-word log-likelihood rises more under
   l's "meets it" persona than under its "fails it" one (:meth:`Judge.criterion_scores`,
   :func:`contrastive_judgments`, which says why the two-order check still holds). A
   small model such as SmolLM2-135M answers "A" to almost every A/B question whatever A
   is, so the A/B judge forms almost no order-consistent edge on it; the per-model
   default and the figures are in ``DEFAULT_EVALUATOR_BY_MODEL`` and bench/RESULTS.md
   ("judge sanity").
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from pathlib import Path

from counselor_engine.backends.base import Backend, BackendError, ChatMessage
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
# How each criterion's vote is obtained (Eq. 7, Eq. 12 and the floor are the same for all):
# "ab" the paper's A/B question; "ab_debiased" the same with the judge's measured position
# bias removed; "contrastive" per-criterion likelihood contrast (no presentation order).
EVALUATORS = ("ab", "ab_debiased", "contrastive")
# The evaluator each model gets when the setting says "auto", chosen from the judge sanity
# set (bench/RESULTS.md, "judge sanity (<model>)"). SmolLM2-135M at the 0.1 floor: the A/B
# judge says "A" 89% of the time whatever A is and formed an edge on 1 of 50 test triples;
# with its position bias removed, 6 of 50 (2 right); contrastive, 141 of 150 (119 right:
# coverage 94%, accuracy 84%). Models not listed get the paper's A/B judge (a model large
# enough to answer A/B questions, as the paper's was).
DEFAULT_EVALUATOR_BY_MODEL = {"smollm2-135m-instruct": "contrastive"}


def model_key(model: str) -> str:
    """A model's name as the tables here spell it: the last path part, lower case
    ("/data/models/SmolLM2-135M-Instruct" and "HuggingFaceTB/SmolLM2-135M-Instruct" are
    both "smollm2-135m-instruct")."""
    return model.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1].lower()


def default_evaluator(model: str) -> str:
    """The evaluator measured best for ``model`` (see ``DEFAULT_EVALUATOR_BY_MODEL``)."""
    return DEFAULT_EVALUATOR_BY_MODEL.get(model_key(model), "ab")


def position_bias_for(model: str, path: Path | None = None) -> dict[str, float]:
    """The per-criterion P(A) measured for ``model`` on the sanity set's dev split
    (``bench.bench_judge_sanity --write-bias``), for the ``ab_debiased`` evaluator.
    Raises ValueError when none was measured: a guessed bias would be worse than none."""
    source = path or PROMPTS / "judge_position_bias.json"
    table = json.loads(source.read_text()) if source.exists() else {}
    key = model_key(model)
    if key not in table:
        raise ValueError(f"no position bias measured for model {key!r} (run bench_judge_sanity)")
    return {str(c): float(b) for c, b in table[key].items()}


@dataclass(frozen=True)
class Criterion:
    id: str
    weight: float
    question: str
    # The contrastive evaluator's two framings: a counselor whose reply meets it / fails it.
    meets: str = ""
    fails: str = ""


@cache
def default_criteria() -> tuple[Criterion, ...]:
    data = json.loads((PROMPTS / "judge_criteria.json").read_text())
    return tuple(
        Criterion(c["id"], float(c["weight"]), c["question"], c["meets"], c["fails"])
        for c in data["criteria"]
    )


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
    p_a: float  # the reading as taken: P(A) (A/B) or sigmoid(score A - score B) (contrastive)
    z_i: float  # P(candidate i preferred) in this order, after any bias removal
    vote: float | None = None  # binary z: 1.0 favours i, 0.0 favours j, None a tie
    bias: float = 0.5  # the measured P(A) removed before the vote (0.5: none)

    def to_dict(self) -> dict[str, object]:
        return {
            "i": self.i,
            "j": self.j,
            "order": self.order,
            "criterion": self.criterion,
            "p_a": self.p_a,
            "z_i": self.z_i,
            "vote": self.vote,
            "bias": self.bias,
        }


def ab_judgment(
    i: int, j: int, order: str, criterion: str, p_a: float, p_b: float, *, bias: float = 0.5
) -> PairJudgment:
    """One A/B reading mapped back to candidate identity, position bias removed.

    ``bias`` is the judge's P(A) for this criterion when content favours neither reply
    (measured on a calibration set with both orders, so content cancels). Removing it is
    a shift: P'(A) = P(A) + (0.5 - bias), P'(B) = P(B) - (0.5 - bias); the binary vote
    compares P'(A) with P'(B) mapped to i and j. ``bias`` = 0.5 is today's judge exactly.
    The two orders stay independent readings, so Eq. 7 still tests that the reply, not
    the slot, carries the preference. A non-finite probability casts no vote (the caller
    then refuses the group).
    """
    shift = 0.5 - bias
    p_a2, p_b2 = p_a + shift, p_b - shift
    z_a = min(1.0, max(0.0, p_a2)) if math.isfinite(p_a2) else p_a2
    z_i = z_a if order == "forward" else 1.0 - z_a
    vote = None
    if _finite([p_a2, p_b2]):
        p_i, p_j = (p_a2, p_b2) if order == "forward" else (p_b2, p_a2)
        vote = criterion_vote(float(p_i), float(p_j))
    return PairJudgment(i, j, order, criterion, float(p_a), float(z_i), vote, float(bias))


def reply_length(reply: str) -> int:
    """A reply's length for the contrastive score: its whitespace-separated words (1 for
    an empty reply, so the score stays finite)."""
    return max(1, len(reply.split()))


def _sigmoid(x: float) -> float:
    if not math.isfinite(x):
        return math.nan
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def contrastive_judgments(
    i: int, j: int, scores_i: Sequence[float], scores_j: Sequence[float], criteria: Sequence[str]
) -> list[PairJudgment]:
    """Both "orders" of one pair from per-criterion contrast scores (see
    :meth:`Judge.criterion_scores`): criterion l votes for the reply whose score is higher.

    Each score comes from a prompt holding that reply alone, so no reply is ever shown
    first: swapping the presentation order maps every reading onto itself, and the
    backward block equals the forward one by construction. Eq. 7 is then applied as
    written: the two supports agree whenever the share is off 0.5, c_ij = 2p - 1, and
    the 0.1 floor still discards near-even splits. What the two-order check guards
    against (a preference carried by the slot, not the reply) cannot arise, so the check
    holds exactly instead of being bypassed. ``p_a`` records sigmoid(score A - score B)
    in each order's A/B labelling, for the clinician's view and the soft rule.
    """
    out: list[PairJudgment] = []
    for order in ("forward", "backward"):
        for cid, s_i, s_j in zip(criteria, scores_i, scores_j, strict=True):
            z_i = _sigmoid(s_i - s_j)
            p_a = z_i if order == "forward" else _sigmoid(s_j - s_i)
            vote = criterion_vote(s_i, s_j) if _finite([s_i, s_j]) else None
            out.append(PairJudgment(i, j, order, cid, p_a, z_i, vote))
    return out


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
        evaluator: str = "ab",
        position_bias: Mapping[str, float] | None = None,
        batch_size: int = 48,
    ) -> None:
        if votes not in VOTES:
            raise ValueError(f"votes: expected one of {', '.join(VOTES)}, got {votes!r}")
        if evaluator not in EVALUATORS:
            raise ValueError(
                f"evaluator: expected one of {', '.join(EVALUATORS)}, got {evaluator!r}"
            )
        if batch_size < 1:
            raise ValueError("batch_size: must be >= 1")
        self.votes = votes
        self.evaluator = evaluator
        self.batch_size = batch_size
        self.backend = backend
        self.criteria = tuple(criteria) if criteria is not None else default_criteria()
        if not self.criteria:
            raise ValueError("criteria: at least one criterion is needed")
        if any(not (c.weight > 0 and math.isfinite(c.weight)) for c in self.criteria):
            raise ValueError("criteria: weights must be positive and finite")
        self.context_chars = context_chars
        self.response_chars = response_chars
        self.position_bias = self._check_bias(position_bias)
        if evaluator == "contrastive" and any(not (c.meets and c.fails) for c in self.criteria):
            raise ValueError("criteria: the contrastive evaluator needs meets/fails framings")

    def _check_bias(self, bias: Mapping[str, float] | None) -> dict[str, float]:
        """Per-criterion P(A) to remove (``ab_debiased`` only; it fails loudly without one)."""
        if self.evaluator != "ab_debiased":
            if bias is not None:
                raise ValueError("position_bias: only the ab_debiased evaluator uses one")
            return {}
        if bias is None:
            raise ValueError("position_bias: the ab_debiased evaluator needs a measured bias")
        missing = [c.id for c in self.criteria if c.id not in bias]
        if missing:
            raise ValueError(f"position_bias: no bias for {', '.join(missing)}")
        out = {c.id: float(bias[c.id]) for c in self.criteria}
        if any(not (0.0 < b < 1.0) for b in out.values()):
            raise ValueError("position_bias: every bias must lie strictly between 0 and 1")
        return out

    # -- prompts ---------------------------------------------------------------------------
    def _pair_prompt(self, ctx: str, a: str, b: str, criterion: Criterion) -> list[ChatMessage]:
        body = (
            f"{ctx}\n\n<reply_A>\n{_clip(a, self.response_chars)}\n</reply_A>\n"
            f"<reply_B>\n{_clip(b, self.response_chars)}\n</reply_B>\n\n"
            f"Criterion: {criterion.question}\nAnswer A or B."
        )
        return [ChatMessage("system", _prompt("judge_pairwise")), ChatMessage("user", body)]

    def _contrast_prompt(self, context: JudgeContext, framing: str) -> list[ChatMessage]:
        """The criterion's persona as the system message, then the conversation as chat
        turns (most recent within ``context_chars``); the reply is scored as the
        assistant's next turn: its own prompt, no other reply in sight.

        The persona is the whole system message: on the dev split a shared preamble
        ("you are a counselor ...", the skill) before it diluted the contrast between the
        two personas. The skill therefore reaches this evaluator only through the
        skill_fidelity persona's wording, not by name.
        """
        budget = self.context_chars
        turns: list[ChatMessage] = [ChatMessage("user", _clip(context.client_message, budget))]
        budget -= len(context.client_message)
        for speaker, text in reversed(context.history):
            if budget - len(text) < 0:
                break
            budget -= len(text)
            turns.append(ChatMessage("user" if speaker == "client" else "assistant", text))
        return [ChatMessage("system", framing), *turns[::-1]]

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
        if self.evaluator == "contrastive":
            judgments = await self._contrastive_group(context, candidates, on_progress)
            if not _finite([jd.p_a for jd in judgments]):
                return self._refused(judgments, pointwise, "non-finite contrast score")
            return self._group(judgments, pointwise)
        keys: list[tuple[int, int, str, Criterion]] = []
        prompts: list[list[ChatMessage]] = []
        for i, j in combinations(range(n), 2):
            for order, (a, b) in (("forward", (i, j)), ("backward", (j, i))):
                for criterion in self.criteria:
                    keys.append((i, j, order, criterion))
                    prompts.append(self._pair_prompt(ctx, candidates[a], candidates[b], criterion))
        shown_as_a = [i if order == "forward" else j for i, j, order, _ in keys]
        probs = await self._pairwise(prompts, shown_as_a, n, on_progress)
        judgments = [
            ab_judgment(
                i, j, order, c.id, float(p_a), float(p_b), bias=self.position_bias.get(c.id, 0.5)
            )
            for (i, j, order, c), (p_a, p_b, *_) in zip(keys, probs, strict=True)
        ]
        if not _finite([float(p) for row in probs for p in row[:2]]):
            return self._refused(judgments, pointwise, "non-finite pairwise probability")
        return self._group(judgments, pointwise)

    def _refused(
        self, judgments: list[PairJudgment], pointwise: list[float], problem: str
    ) -> GroupJudgment:
        return GroupJudgment(
            support={}, pointwise=pointwise, judgments=judgments, admissible=False, problem=problem
        )

    def _group(self, judgments: list[PairJudgment], pointwise: list[float]) -> GroupJudgment:
        """Eq. 12 supports from the readings (the same for every evaluator)."""
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

    async def _contrastive_group(
        self,
        context: JudgeContext,
        candidates: Sequence[str],
        on_progress: ProgressCallback | None,
    ) -> list[PairJudgment]:
        """Pair readings from each reply's criterion scores: every reply is scored once
        (all of them together, see :meth:`criterion_scores`) and every pair reuses them.
        Progress is told after each backend call, in the A/B judge's units (pairs in
        both orders), so the page's bar reads the same whichever evaluator runs."""
        n = len(candidates)
        total = n * (n - 1)
        told: Callable[[float], None] | None = None
        if on_progress is not None:
            on_progress(0, total)
            told = _in_units(on_progress, total)
        scores = await self.criterion_scores(context, candidates, on_progress=told)
        ids = [c.id for c in self.criteria]
        return [
            jd
            for i, j in combinations(range(n), 2)
            for jd in contrastive_judgments(i, j, scores[i], scores[j], ids)
        ]

    async def criterion_scores(
        self,
        context: JudgeContext,
        replies: Sequence[str],
        *,
        on_progress: Callable[[float], None] | None = None,
    ) -> list[list[float]]:
        """Per reply and criterion: [log p(reply | "meets it") - log p(reply | "fails it")]
        divided by the reply's length in words (:func:`reply_length`).

        Both log-likelihoods are of the same reply tokens, so its wording cancels and
        what is left is how much more the model expects this reply from a counselor who
        meets the criterion than from a responder who fails it. Per word, because the two
        personas shift every token a little, whatever it says: summed, that shift grows
        with length, and on the dev split the summed score preferred the shorter reply
        (10 of 24 edges right) where the per-word one points the right way (21 of 26).
        Words, not tokens: the Backend protocol returns sums only, and a word count is
        the same on every backend; within one language tokens per word vary little. Always
        the base model (``adapter=None``).

        Sent persona-major (every reply under one persona together) in chunks of whole
        personas of at most ``batch_size`` sequences (a padded batch of every prompt at
        once would hold all of them in memory together; more replies than ``batch_size``
        split a persona). A persona + conversation prompt is then a prefix its replies
        share within one call, which the backends read once (transformers: shared
        prefixes; vLLM: its prefix cache) rather than once per reply (issue 23).
        ``on_progress(share done)`` after each call.
        """
        clipped = [_clip(reply, self.response_chars) for reply in replies]
        lengths = [reply_length(reply) for reply in clipped]
        framings = [framing for c in self.criteria for framing in (c.meets, c.fails)]
        rows = [(f, r) for f in range(len(framings)) for r in range(len(clipped))]
        n = max(1, len(clipped))
        step = (self.batch_size // n) * n if n <= self.batch_size else self.batch_size
        prompts = [self._contrast_prompt(context, framing) for framing in framings]
        logp: dict[tuple[int, int], float] = {}
        for k in range(0, len(rows), step):
            chunk = rows[k : k + step]
            got = await self.backend.sequence_logprobs(
                [prompts[f] for f, _ in chunk], [clipped[r] for _, r in chunk]
            )
            if len(got) != len(chunk):
                raise BackendError("sequence_logprobs: wrong number of scores")
            logp.update(zip(chunk, got, strict=True))
            if on_progress is not None:
                on_progress((k + len(chunk)) / len(rows))
        return [
            [(logp[(2 * c, r)] - logp[(2 * c + 1, r)]) / length for c in range(len(self.criteria))]
            for r, length in enumerate(lengths)
        ]

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


def _in_units(on_progress: ProgressCallback, total: int) -> Callable[[float], None]:
    """A share-done callback that tells ``on_progress`` in steps out of ``total``."""
    return lambda share: on_progress(round(share * total), total)


def _expected_digit(row: Sequence[float]) -> float:
    """E[rating] over "1".."5"; NaN propagates so the caller can refuse the group."""
    total = sum(row)
    if not math.isfinite(total) or total <= 0:
        return math.nan
    return sum((k + 1) * p for k, p in enumerate(row)) / total
