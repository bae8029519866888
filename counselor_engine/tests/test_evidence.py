"""Only sound evidence moves the learning state (paper H.7): a session whose judged turn
outcomes are all tied, whose judge failed, or that has fewer than two judged turns updates
no posterior cell, and keeps a record of why; imputed outcomes never reach Eq. 4."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine import soca
from counselor_engine.backends.base import GenerationParams
from counselor_engine.counselor import (
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
    SessionOutcome,
)
from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.memory import MemoryStore
from counselor_engine.soca import check_session_evidence
from counselor_engine.tests.fakes import FakeBackend

unit = st.floats(0, 1)
# Outcomes on a 1/1000 grid so exact ties are common, and ties broken by one step of
# 1e-9 or by one float ulp: distinct values that any score-compressing judge produces.
grid = st.integers(0, 1000).map(lambda k: k / 1000)


# --- the pure rule ---------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(grid, st.integers(2, 12), st.lists(st.none(), max_size=3))
def test_all_tied_outcomes_are_skipped_with_zero_variance(value, count, gaps) -> None:  # type: ignore[no-untyped-def]
    outcomes = [value] * count + gaps  # unjudged turns (None) never count
    check = check_session_evidence(outcomes)
    assert check.skip == soca.SKIP_ALL_TIED and not check.sound
    assert check.judged == count and check.variance == 0.0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(0.001, 0.999), min_size=2, max_size=12),
    st.sampled_from(["ulp", "1e-9"]),
)
def test_near_ties_are_an_order_and_count_as_sound(values, step) -> None:  # type: ignore[no-untyped-def]
    """Values nudged apart by one ulp or 1e-9 are distinct: Eq. 8 sees only their order
    (Proposition 1), so they get the same ordinal levels as a well-separated copy."""
    base = values[0]
    near = [base]
    for _ in values[1:]:
        near.append(float(np.nextafter(near[-1], 1.0)) if step == "ulp" else near[-1] + 1e-9)
    check = check_session_evidence(near)
    assert check.sound and check.judged == len(near)
    assert check.variance is not None and check.variance >= 0.0
    separated = [k / len(near) for k in range(len(near))]
    assert soca.ordinal_levels(near) == soca.ordinal_levels(separated)


@settings(max_examples=150, deadline=None)
@given(st.lists(unit | st.none(), max_size=10), st.booleans())
def test_the_rules_and_the_recorded_variance(outcomes, judge_failed) -> None:  # type: ignore[no-untyped-def]
    judged = [v for v in outcomes if v is not None]
    check = check_session_evidence(outcomes, judge_failed=judge_failed)
    assert check.judged == len(judged)
    if judged and check.skip != soca.SKIP_ALL_TIED:
        assert check.variance == pytest.approx(float(np.var(judged)), abs=1e-15)
    if judge_failed:
        expected = soca.SKIP_JUDGE_FAILED  # first: nothing read before a failure is trusted
    elif len(judged) < 2:
        expected = soca.SKIP_TOO_FEW_JUDGED
    elif len(set(judged)) == 1:
        expected = soca.SKIP_ALL_TIED
    else:
        expected = ""
    assert check.skip == expected
    assert check.to_dict() == {"judged": check.judged, "variance": check.variance, "skip": expected}


def test_it_refuses_an_outcome_outside_the_unit_interval() -> None:
    with pytest.raises(ValueError, match="outcomes"):
        check_session_evidence([0.2, 1.5])


# --- the counselor's session end -------------------------------------------------------------

FAST = GenerationParams(max_new_tokens=8)
MESSAGES = (
    "I feel anxious about work",
    "It gets worse at night",
    "My partner tries to help",
    "I do not know what to try",
    "Maybe I could rest more",
)


def _digits(r: float) -> list[float]:
    """A 1-5 distribution whose (E - 1) / 4 is r: mass r on "5", the rest on "1"."""
    return [1.0 - r, 0.0, 0.0, 0.0, r]


async def _session(
    outcomes: list[float], *, fail_judge: bool = False
) -> tuple[ClientState, SessionOutcome]:
    """len(outcomes) + 1 turns: each judged turn t gets R_t = outcomes[t] (four equal
    aspect readings); the last turn has no reaction. n = 1 candidate, no memory."""
    rows = [[1.0] * 5] * (len(outcomes) + 1)  # one pointwise row per turn
    for r in outcomes:
        rows += [_digits(r)] * 4
    backend = FakeBackend().script_probabilities(*rows)
    config = CounselorConfig(n_candidates=1, generation=FAST, seed=5, memory_k=0)
    counselor = Counselor(backend, config=config)
    state = ClientState("c1", "cbt", 0, 4, memory=MemoryStore(embedder=HashingEmbedder()))
    counselor.start_session(state, None)
    for text in MESSAGES[: len(outcomes) + 1]:
        events = [e async for e in counselor.respond(text)]
        assert isinstance(events[-1], DoneEvent)
    if fail_judge:
        backend.fail_always("choice_probabilities")
    return state, await counselor.end_session(None)


@settings(max_examples=25, deadline=None)
@given(grid, st.integers(2, 4))
def test_a_tied_session_updates_no_posterior_cell(value, judged) -> None:  # type: ignore[no-untyped-def]
    state, outcome = asyncio.run(_session([value] * judged))
    assert outcome.posterior_updates == [] and state.posterior.cells() == {}
    assert outcome.evidence.skip == soca.SKIP_ALL_TIED
    assert outcome.credit == [None] * (judged + 1)
    assert outcome.turn_outcomes[:judged] == pytest.approx([value] * judged)


@settings(max_examples=25, deadline=None)
@given(st.integers(100, 900), st.integers(2, 4))
def test_a_near_tied_session_updates_exactly_its_judged_turns(k, judged) -> None:  # type: ignore[no-untyped-def]
    outcomes = [k / 1000 + t * 1e-9 for t in range(judged)]
    _, outcome = asyncio.run(_session(outcomes))
    assert outcome.evidence.sound
    assert len(outcome.posterior_updates) == judged
    assert outcome.credit[-1] is None and outcome.turn_outcomes[-1] is None
    # Eq. 8-9 over the judged outcomes only: nothing imputed for the last turn.
    judged_outcomes = [float(v) for v in outcome.turn_outcomes[:judged] if v is not None]
    assert len(judged_outcomes) == judged
    expected = soca.trajectory_returns(judged_outcomes, outcome.projected_session_reward)
    assert outcome.credit[:judged] == pytest.approx(expected)
    assert [u.G for u in outcome.posterior_updates] == pytest.approx(expected)


async def test_one_judged_turn_is_too_few() -> None:
    state, outcome = await _session([0.8])
    assert outcome.evidence.skip == soca.SKIP_TOO_FEW_JUDGED
    assert outcome.posterior_updates == [] and state.posterior.cells() == {}
    # The judged outcome is a real observation: the reward joins the history.
    assert outcome.reward_observed and state.session_rewards == [pytest.approx(0.8)]


async def test_a_failed_judge_is_recorded_and_skipped_not_imputed() -> None:
    state, outcome = await _session([0.2, 0.9, 0.4], fail_judge=True)
    assert outcome.evidence.skip == soca.SKIP_JUDGE_FAILED
    assert outcome.turn_outcomes == [None] * 4
    assert outcome.posterior_updates == [] and state.posterior.cells() == {}
    assert not outcome.reward_observed and state.session_rewards == []


def test_the_issue_example_would_have_moved_every_cell() -> None:
    """Why the skip matters: six imputed 0.5 outcomes give returns from about 2.6 down to
    0.95, large positive residuals from no information."""
    returns = soca.trajectory_returns([0.5] * 6, 0.5)
    assert returns[0] == pytest.approx(2.6, abs=0.05) and returns[-1] == pytest.approx(0.95)
    assert check_session_evidence([0.5] * 6).skip == soca.SKIP_ALL_TIED
