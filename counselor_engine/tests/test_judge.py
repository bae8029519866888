"""The internal judge reads probabilities, maps both orders back to candidates (Eq. 12)
and batches every prompt of a group into one backend call."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from counselor_engine.judge import Criterion, Judge, JudgeContext, default_criteria
from counselor_engine.tests.fakes import FakeBackend

CONTEXT = JudgeContext((), "I keep worrying about my exams", "Socratic questioning")


class PreferringBackend(FakeBackend):
    """Prefers the reply containing ``best`` by a fixed margin, in either position."""

    def __init__(
        self, best: str, margin: float = 0.4, point: Sequence[float] | None = None
    ) -> None:
        super().__init__()
        self.best = best
        self.margin = margin
        self.point = point
        self.batches: list[int] = []

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        self.calls["choice_probabilities"] += 1
        self.batches.append(len(prompts))
        rows = []
        for prompt in prompts:
            body = prompt[-1].content
            if tuple(choices) == ("A", "B"):
                a = body.split("<reply_A>")[1].split("</reply_A>")[0]
                p_a = 0.5 + self.margin if self.best in a else 0.5 - self.margin
                rows.append([p_a, 1 - p_a])
            else:
                rows.append(list(self.point or [0.2] * 5))
        return rows


def test_there_are_twelve_positive_criteria() -> None:
    criteria = default_criteria()
    assert len(criteria) == 12
    assert len({c.id for c in criteria}) == 12
    assert all(c.weight > 0 for c in criteria)


async def test_it_maps_both_orders_back_to_the_candidates() -> None:
    backend = PreferringBackend("BEST")
    judged = await Judge(backend).judge_group(CONTEXT, ["plain", "BEST reply", "other"])
    assert judged.admissible
    assert judged.support[(0, 1)] == (0.0, 0.0)  # every criterion votes against 0, both orders
    assert judged.support[(1, 2)] == (1.0, 1.0)
    assert judged.support[(0, 2)] == (0.0, 1.0)  # neither is best: A always loses


async def test_soft_votes_average_the_probabilities_when_asked() -> None:
    backend = PreferringBackend("BEST")
    judge = Judge(backend, votes="soft")
    judged = await judge.judge_group(CONTEXT, ["plain", "BEST reply", "other"])
    assert judged.support[(0, 1)] == pytest.approx((0.1, 0.1))
    assert judged.support[(1, 2)] == pytest.approx((0.9, 0.9))
    assert judged.support[(0, 2)] == pytest.approx((0.1, 0.9))


async def test_binary_votes_are_the_default_and_recorded_per_reading() -> None:
    backend = PreferringBackend("BEST", margin=0.01)  # a judge that barely leans
    judged = await Judge(backend).judge_group(CONTEXT, ["BEST", "plain"])
    assert judged.support[(0, 1)] == (1.0, 1.0)
    assert {jd.vote for jd in judged.judgments} == {1.0}
    assert all(jd.to_dict()["vote"] == 1.0 for jd in judged.judgments)
    soft = await Judge(backend, votes="soft").judge_group(CONTEXT, ["BEST", "plain"])
    assert soft.support[(0, 1)] == pytest.approx((0.51, 0.51))


class SplitBackend(PreferringBackend):
    """Criterion x ties exactly; criterion y favours "BEST" by a hair."""

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        rows = await super().choice_probabilities(prompts, choices, adapter=adapter)
        return [
            [0.5, 0.5] if "Criterion: x?" in prompt[-1].content and len(row) == 2 else row
            for prompt, row in zip(prompts, rows, strict=True)
        ]


async def test_an_exact_tie_is_no_vote_for_either_candidate() -> None:
    criteria = [Criterion("x", 10.0, "x?"), Criterion("y", 1.0, "y?")]
    backend = SplitBackend("BEST", margin=0.001)
    judged = await Judge(backend, criteria=criteria).judge_group(CONTEXT, ["plain", "BEST"])
    # The heavy tied criterion neither helps nor hurts: the light one decides alone.
    assert judged.support[(0, 1)] == (0.0, 0.0)
    assert [jd.vote for jd in judged.judgments if jd.criterion == "x"] == [None, None]


def test_an_unknown_vote_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="votes"):
        Judge(FakeBackend(), votes="majority")


async def test_it_batches_all_pairs_and_orders_into_one_call() -> None:
    backend = PreferringBackend("BEST")
    await Judge(backend).judge_group(CONTEXT, ["a", "b", "c", "d", "BEST"])
    assert backend.calls["choice_probabilities"] == 2  # pointwise + all pairwise
    assert sorted(backend.batches) == [5, 10 * 2 * 12]


async def test_support_is_the_weighted_share_of_criteria() -> None:
    backend = PreferringBackend("BEST", margin=0.5)  # z is exactly 0 or 1
    criteria = [Criterion("x", 3.0, "x?"), Criterion("y", 1.0, "y?")]
    judged = await Judge(backend, criteria=criteria).judge_group(CONTEXT, ["BEST", "plain"])
    assert judged.support[(0, 1)] == pytest.approx((1.0, 1.0))


async def test_pointwise_is_the_expected_digit() -> None:
    backend = PreferringBackend("BEST", point=[0.0, 0.0, 0.5, 0.0, 0.5])
    judged = await Judge(backend).judge_group(CONTEXT, ["a", "b"])
    assert judged.pointwise == pytest.approx([4.0, 4.0])


async def test_a_nan_probability_makes_the_group_inadmissible() -> None:
    backend = PreferringBackend("BEST", point=[math.nan, 0, 0, 0, 1])
    judged = await Judge(backend).judge_group(CONTEXT, ["a", "BEST"])
    assert not judged.admissible
    assert "non-finite" in judged.problem


async def test_turn_outcomes_are_batched_and_lie_in_the_unit_interval() -> None:
    backend = PreferringBackend("x", point=[0, 0, 0, 0, 1])
    judge = Judge(backend)
    values = await judge.turn_outcomes([("reply one", "thanks, that helps"), ("reply two", "ok")])
    assert values == pytest.approx([1.0, 1.0])
    assert backend.batches == [8]
    backend.point = [1, 0, 0, 0, 0]
    assert await judge.turn_outcome("r", "no") == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"criteria": []}, "criteria"), ({"criteria": [Criterion("x", -1.0, "?")]}, "criteria")],
)
def test_bad_configuration_is_refused(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        Judge(FakeBackend(), **kwargs)


async def test_an_empty_group_and_an_empty_reaction_are_refused() -> None:
    judge = Judge(FakeBackend())
    with pytest.raises(ValueError, match="candidates"):
        await judge.judge_group(CONTEXT, [])
    with pytest.raises(ValueError, match="client_next"):
        await judge.turn_outcome("reply", "   ")
