"""The three ways a criterion's vote can be obtained (ab, ab_debiased, contrastive), all
feeding the same Eq. 12 binary votes, Eq. 7 and the 0.1 floor; and the sanity-set
measure (coverage, accuracy)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from counselor_engine import soca
from counselor_engine.judge import (
    Judge,
    JudgeContext,
    PairJudgment,
    ab_judgment,
    contrastive_judgments,
    default_criteria,
)
from counselor_engine.judge_eval import load_sanity_set, score
from counselor_engine.tests.fakes import FakeBackend

CONTEXT = JudgeContext(
    (("client", "I failed again."), ("counselor", "That sounds hard.")),
    "I keep worrying about my exams",
    "Socratic questioning",
)
SANITY = Path(__file__).resolve().parents[2] / "bench" / "data" / "judge_sanity.json"
IDS = [c.id for c in default_criteria()]


class FramingBackend(FakeBackend):
    """log p(reply) is 1 nat higher under a "meets" framing than a "fails" one for the
    reply containing ``best``; for other replies it is the same under both. A constant
    per-reply offset (its length) is added so that length alone would mislead a judge
    that compared raw likelihoods."""

    def __init__(self, best: str, score: float = 1.0) -> None:
        super().__init__()
        self.best = best
        self.score = score
        self.meets = {c.meets for c in default_criteria()}
        self.batches: list[int] = []

    async def sequence_logprobs(self, prompts, responses, *, adapter=None):  # type: ignore[no-untyped-def]
        await self._enter("sequence_logprobs", adapter=adapter)
        self.batches.append(len(prompts))
        out = []
        for prompt, reply in zip(prompts, responses, strict=True):
            framing = prompt[0].content.splitlines()[-1]
            lift = self.score if (self.best in reply and framing in self.meets) else 0.0
            out.append(-3.0 * len(reply.split()) + lift)
        return out


async def test_contrastive_votes_for_the_reply_the_meets_framing_lifts() -> None:
    backend = FramingBackend("BEST")
    judge = Judge(backend, evaluator="contrastive")
    judged = await judge.judge_group(CONTEXT, ["a short plain one", "BEST but much longer reply"])
    assert judged.admissible
    assert judged.support[(0, 1)] == (0.0, 0.0)  # every criterion, both "orders", for 1
    edges = soca.build_preference_graph(2, judged.support)
    assert [(e.winner, e.loser) for e in edges] == [(1, 0)]
    assert all(jd.vote == 0.0 for jd in judged.judgments)


async def test_contrastive_readings_do_not_depend_on_candidate_order() -> None:
    backend = FramingBackend("BEST")
    judge = Judge(backend, evaluator="contrastive")
    one = await judge.judge_group(CONTEXT, ["plain", "BEST", "other"])
    two = await judge.judge_group(CONTEXT, ["BEST", "other", "plain"])
    assert one.support[(0, 1)] == (0.0, 0.0) and two.support[(0, 2)] == (1.0, 1.0)
    assert one.support[(0, 2)] == two.support[(1, 2)] == (0.5, 0.5)  # all ties: no votes


async def test_contrastive_length_cancels_between_the_two_framings() -> None:
    """Neither reply is lifted: a shorter reply has a higher raw likelihood, yet no
    criterion votes and Eq. 7 forms no edge."""
    backend = FramingBackend("nowhere")
    judged = await Judge(backend, evaluator="contrastive").judge_group(
        CONTEXT, ["short", "a much much longer reply here"]
    )
    assert judged.support[(0, 1)] == (0.5, 0.5)
    assert soca.build_preference_graph(2, judged.support) == []
    assert {jd.vote for jd in judged.judgments} == {None}


async def test_contrastive_scores_each_reply_once_on_the_base_model_in_chunks() -> None:
    backend = FramingBackend("BEST")
    judge = Judge(backend, evaluator="contrastive", batch_size=10)
    await judge.judge_group(CONTEXT, ["plain", "BEST", "other", "more"])
    assert sum(backend.batches) == 4 * 2 * len(IDS)  # per reply, per criterion, two framings
    assert max(backend.batches) <= 10
    assert {kw["adapter"] for method, kw in backend.log if method == "sequence_logprobs"} == {None}


def test_contrastive_prompt_holds_the_conversation_and_one_framing() -> None:
    judge = Judge(FakeBackend(), evaluator="contrastive")
    prompt = judge._contrast_prompt(CONTEXT, "FRAMING")
    assert [m.role for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[0].content == "FRAMING"
    assert [m.content for m in prompt[1:]] == [
        "I failed again.",
        "That sounds hard.",
        CONTEXT.client_message,
    ]


def test_contrastive_prompt_keeps_the_most_recent_turns_within_the_budget() -> None:
    judge = Judge(FakeBackend(), evaluator="contrastive", context_chars=50)
    prompt = judge._contrast_prompt(CONTEXT, "FRAMING")
    assert [m.content for m in prompt[1:]] == ["That sounds hard.", CONTEXT.client_message]


class ShiftBackend(FakeBackend):
    """The "meets" persona lifts every word of every reply by 0.5 nats (a persona shift
    that says nothing about the reply), and each word of the reply containing "BEST" by
    0.2 more."""

    def __init__(self) -> None:
        super().__init__()
        self.meets = {c.meets for c in default_criteria()}

    async def sequence_logprobs(self, prompts, responses, *, adapter=None):  # type: ignore[no-untyped-def]
        out = []
        for prompt, reply in zip(prompts, responses, strict=True):
            words = len(reply.split())
            per_word = (
                (0.5 + (0.2 if "BEST" in reply else 0.0))
                if prompt[0].content in self.meets
                else 0.0
            )
            out.append(-2.0 * words + per_word * words)
        return out


async def test_a_persona_shift_per_word_does_not_favour_the_longer_reply() -> None:
    long_plain = " ".join(["word"] * 20)
    judged = await Judge(ShiftBackend(), evaluator="contrastive").judge_group(
        CONTEXT, [long_plain, "BEST short reply"]
    )
    # Summed, the plain reply would win (10 nats against 2.1); per word the lift is 0.5
    # against 0.7, and every criterion votes for the reply that was lifted more.
    assert judged.support[(0, 1)] == (0.0, 0.0)


async def test_contrastive_reports_progress_after_each_call() -> None:
    """In the A/B judge's units (3 replies: 6 pairs in both orders), from 0 to done, one
    step per backend call; persona-major chunks of whole personas (batch 18: 6 personas
    x 3 replies), so 24 personas take 4 calls."""
    seen: list[tuple[int, int]] = []
    backend = FramingBackend("BEST")
    await Judge(backend, evaluator="contrastive", batch_size=20).judge_group(
        CONTEXT, ["a", "BEST", "c"], on_progress=lambda d, t: seen.append((d, t))
    )
    assert backend.batches == [18, 18, 18, 18]
    assert seen == [(0, 6), (2, 6), (3, 6), (4, 6), (6, 6)]


async def test_contrastive_sends_every_reply_under_one_persona_together() -> None:
    """What lets a backend read each persona + conversation prompt once per call."""
    backend = FramingBackend("BEST")
    sent: list[list[tuple[str, str]]] = []
    real = backend.sequence_logprobs

    async def spy(prompts, responses, *, adapter=None):  # type: ignore[no-untyped-def]
        sent.append([(p[0].content, r) for p, r in zip(prompts, responses, strict=True)])
        return await real(prompts, responses, adapter=adapter)

    backend.sequence_logprobs = spy  # type: ignore[method-assign]
    replies = ["a", "BEST", "c", "d"]
    await Judge(backend, evaluator="contrastive", batch_size=10).judge_group(CONTEXT, replies)
    for call in sent:
        assert len(call) == 8  # two whole personas of four replies each
        assert [r for _, r in call] == replies * 2
        assert len({persona for persona, _ in call[:4]}) == 1


async def test_a_non_finite_contrast_score_makes_the_group_inadmissible() -> None:
    backend = FakeBackend().script_logprobs(math.nan, *[0.0] * 200)
    judged = await Judge(backend, evaluator="contrastive").judge_group(CONTEXT, ["a", "b"])
    assert not judged.admissible
    assert judged.support == {}
    assert "contrast" in judged.problem


async def test_contrastive_on_a_real_tiny_model_is_a_per_word_likelihood_difference(
    tiny_backend,
) -> None:  # type: ignore[no-untyped-def]
    judge = Judge(tiny_backend, evaluator="contrastive")
    [scores] = await judge.criterion_scores(CONTEXT, ["I hear you."])
    c = judge.criteria[0]
    meets, fails = await tiny_backend.sequence_logprobs(
        [judge._contrast_prompt(CONTEXT, c.meets), judge._contrast_prompt(CONTEXT, c.fails)],
        ["I hear you.", "I hear you."],
    )
    assert scores[0] == pytest.approx((meets - fails) / 3, abs=1e-4)  # three words
    assert all(math.isfinite(s) for s in scores) and len(scores) == 12


def test_contrastive_judgments_are_the_same_in_both_orders() -> None:
    out = contrastive_judgments(0, 1, [2.0, -1.0, 0.0], [1.0, 1.0, 0.0], ["x", "y", "z"])
    forward, backward = out[:3], out[3:]
    assert [jd.vote for jd in forward] == [jd.vote for jd in backward] == [1.0, 0.0, None]
    assert [jd.z_i for jd in forward] == [jd.z_i for jd in backward]
    assert forward[0].p_a == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert backward[0].p_a == pytest.approx(1 - forward[0].p_a)


class SlotBackend(FakeBackend):
    """A judge that says "A" about 90% of the time, leaning 2 points toward ``best``."""

    def __init__(self, best: str) -> None:
        super().__init__()
        self.best = best

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        rows = []
        for prompt in prompts:
            body = prompt[-1].content
            if tuple(choices) != ("A", "B"):
                rows.append([0.2] * 5)
                continue
            a = body.split("<reply_A>")[1].split("</reply_A>")[0]
            p_a = 0.92 if self.best in a else 0.88
            rows.append([p_a, 1 - p_a])
        return rows


async def test_position_bias_leaves_the_plain_ab_judge_without_edges() -> None:
    judged = await Judge(SlotBackend("BEST")).judge_group(CONTEXT, ["BEST", "plain"])
    assert judged.support[(0, 1)] == (1.0, 0.0)  # "A" wins in both orders
    assert soca.build_preference_graph(2, judged.support) == []


async def test_removing_the_measured_bias_recovers_the_lean() -> None:
    bias = dict.fromkeys(IDS, 0.9)
    judge = Judge(SlotBackend("BEST"), evaluator="ab_debiased", position_bias=bias)
    judged = await judge.judge_group(CONTEXT, ["plain", "BEST"])
    assert judged.support[(0, 1)] == (0.0, 0.0)
    assert [(e.winner, e.loser) for e in soca.build_preference_graph(2, judged.support)] == [(1, 0)]
    assert {jd.bias for jd in judged.judgments} == {0.9}
    assert all(jd.to_dict()["bias"] == 0.9 for jd in judged.judgments)


@given(st.floats(0.0, 1.0), st.sampled_from(["forward", "backward"]))
def test_a_bias_of_one_half_is_the_plain_ab_vote(p_a: float, order: str) -> None:
    jd = ab_judgment(0, 1, order, "x", p_a, 1.0 - p_a)
    p_i, p_j = (p_a, 1.0 - p_a) if order == "forward" else (1.0 - p_a, p_a)
    assert jd.vote == soca.criterion_vote(p_i, p_j)
    assert jd.z_i == (p_a if order == "forward" else 1.0 - p_a)


@given(st.floats(0.0, 1.0), st.floats(0.01, 0.99))
def test_the_debiased_vote_compares_p_a_with_the_bias(p_a: float, bias: float) -> None:
    fwd = ab_judgment(0, 1, "forward", "x", p_a, 1.0 - p_a, bias=bias)
    bwd = ab_judgment(0, 1, "backward", "x", p_a, 1.0 - p_a, bias=bias)
    if abs(p_a - bias) > 1e-9:
        assert fwd.vote == (1.0 if p_a > bias else 0.0)  # i shown as A
        assert bwd.vote == (0.0 if p_a > bias else 1.0)  # j shown as A
    assert 0.0 <= fwd.z_i <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"evaluator": "vibes"}, "evaluator"),
        ({"evaluator": "ab_debiased"}, "needs a measured bias"),
        ({"evaluator": "ab_debiased", "position_bias": {"empathy": 0.9}}, "no bias for"),
        ({"evaluator": "ab_debiased", "position_bias": dict.fromkeys(IDS, 1.0)}, "strictly"),
        ({"evaluator": "ab", "position_bias": dict.fromkeys(IDS, 0.9)}, "only the ab_debiased"),
        ({"evaluator": "contrastive", "batch_size": 0}, "batch_size"),
    ],
)
def test_bad_evaluator_settings_are_refused(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        Judge(FakeBackend(), **kwargs)


def test_contrastive_needs_framings_for_every_criterion() -> None:
    from counselor_engine.judge import Criterion

    with pytest.raises(ValueError, match="framings"):
        Judge(FakeBackend(), evaluator="contrastive", criteria=[Criterion("x", 1.0, "q?")])


def test_every_shipped_criterion_has_two_different_framings() -> None:
    for c in default_criteria():
        assert c.meets and c.fails and c.meets != c.fails


# -- the sanity set and its measure ------------------------------------------------------------
def test_the_sanity_set_has_150_test_triples_apart_from_dev() -> None:
    test, dev = load_sanity_set(SANITY, "test"), load_sanity_set(SANITY, "dev")
    assert len(test) >= 150 and len(dev) >= 20
    assert not {t.context_id for t in test} & {t.context_id for t in dev}
    texts = [t.context.client_message for t in test] + [t.context.client_message for t in dev]
    assert not {t.context.client_message for t in test} & {t.context.client_message for t in dev}
    assert len(set(texts)) == len({t.context_id for t in test + dev})
    assert all(t.better != t.worse for t in test + dev)
    kinds = json.loads(SANITY.read_text())["kinds"]
    assert {t.kind for t in test} == set(kinds)


def test_an_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        load_sanity_set(SANITY, "train")


def _pair(votes_fwd: list[float | None], votes_bwd: list[float | None]) -> list[PairJudgment]:
    ids = IDS[: len(votes_fwd)]
    out = [
        PairJudgment(0, 1, "forward", c, 0.5, 0.5, v) for c, v in zip(ids, votes_fwd, strict=True)
    ]
    out += [
        PairJudgment(0, 1, "backward", c, 0.5, 0.5, v) for c, v in zip(ids, votes_bwd, strict=True)
    ]
    return out


def test_coverage_and_accuracy_follow_eq7_at_the_floor() -> None:
    [t1, t2, t3, t4] = load_sanity_set(SANITY, "test")[:4]
    weights = {"empathy": 1.0, "validation": 1.0}
    groups = [
        (t1, _pair([1.0, 1.0], [1.0, 1.0])),  # edge to the better reply
        (t2, _pair([0.0, 0.0], [0.0, 1.0])),  # p = (0, 0.5): no edge (a tie in one order)
        (t3, _pair([0.0, 0.0], [0.0, 0.0])),  # edge to the worse reply
        (t4, _pair([1.0, 1.0], [0.0, 0.0])),  # the orders disagree: no edge
    ]
    result = score(groups, weights)
    assert (result.overall.pairs, result.overall.edges, result.overall.correct) == (4, 2, 1)
    assert result.overall.coverage == 0.5 and result.overall.accuracy == 0.5
    emp, val = result.by_criterion["empathy"], result.by_criterion["validation"]
    assert (emp.edges, emp.correct) == (3, 1)  # t1, t2, t3 agree across orders
    assert (val.edges, val.correct) == (2, 1)  # t1, t3
    assert sum(k.pairs for k in result.by_kind.values()) == 4


def test_score_refuses_readings_in_the_wrong_layout() -> None:
    [t1] = load_sanity_set(SANITY, "test")[:1]
    with pytest.raises(ValueError, match="forward then backward"):
        score([(t1, _pair([1.0], [1.0])[::-1])], {"empathy": 1.0, "validation": 1.0})


# -- the default model (slow: about 10 minutes on 2 busy cores) ----------------------------------
@pytest.mark.slow
async def test_on_smollm2_the_default_evaluator_forms_right_edges_at_the_floor() -> None:
    """The per-model default on the dev split (the split its wording was chosen on; the
    held-out test figures are in bench/RESULTS.md): the issue's targets, coverage >= 40%
    and accuracy >= 75% at the 0.1 floor."""
    from counselor_engine import models
    from counselor_engine.backends.transformers_backend import TransformersBackend
    from counselor_engine.judge import default_evaluator

    path = models.ensure_default_model()
    judge = Judge(TransformersBackend(path), evaluator=default_evaluator(path.name))
    by_context: dict[str, list] = {}  # type: ignore[type-arg]
    for t in load_sanity_set(SANITY, "dev"):
        by_context.setdefault(t.context_id, []).append(t)
    groups = []
    per = 2 * len(IDS)
    for triples in by_context.values():
        # One group per context: the better reply (0) and the five worse ones, as a turn
        # with six candidates is judged; pairs (0, k) come first, one block of readings each.
        group = await judge.judge_group(
            triples[0].context, [triples[0].better, *(t.worse for t in triples)]
        )
        assert group.admissible
        for k, t in enumerate(triples):
            block = group.judgments[k * per : (k + 1) * per]
            assert {(jd.i, jd.j) for jd in block} == {(0, k + 1)}
            groups.append((t, [replace(jd, i=0, j=1) for jd in block]))
    result = score(groups, {c.id: c.weight for c in default_criteria()})
    assert result.overall.coverage >= 0.4
    assert result.overall.accuracy >= 0.75
