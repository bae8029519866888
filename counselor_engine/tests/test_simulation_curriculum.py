"""Curriculum controller (dual-loop curriculum paper, Sec. 3.4-3.5) against hand computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.simulation.curriculum import CurriculumConfig, CurriculumController
from counselor_engine.simulation.interaction import ALL_STATES

CFG = CurriculumConfig(eta=0.5, alpha=2.0, lam=2.0, c_ucb=0.5, a_min=0.05, gamma=1.0, epsilon=0.1)


def test_it_matches_a_hand_computed_two_intent_case() -> None:
    ctl = CurriculumController(["a", "b"], CFG)
    ctl.update("a", ALL_STATES[0], [0.6, 0.4])  # y = (1, 0): p_m = 1/2
    ctl.update("b", ALL_STATES[0], [0.9])  # y = (1,): p_m = 1
    # Intent a, state 0: S = 0.5, N = 1; the other intent gives S^-a = 1, N^-a = 1, N = 2.
    pooled = (1 + 2 / 2) / (1 + 2)  # (S^-c + alpha/2) / (N^-c + alpha) = 2/3
    p_hat = (0.5 + 2 * pooled) / (1 + 2)  # 0.6111
    boundary = 1 - 2 * abs(p_hat - 0.5)  # 0.7778
    bonus = math.sqrt(math.log(3) / 2)
    a0 = boundary + 0.5 * bonus
    # Any unvisited state of a: p^ = 1/2 (no evidence anywhere), B = 1, U = sqrt(log 3 / 1).
    a_other = 1 + 0.5 * math.sqrt(math.log(3))
    total = a0 + 23 * a_other
    expected = [0.9 * a0 / total + 0.1 / 24] + [0.9 * a_other / total + 0.1 / 24] * 23
    assert ctl.pass_rates("a")[0] == pytest.approx(0.6111111111)
    assert ctl.allocation_scores("a")[0] == pytest.approx(a0)
    assert ctl.distribution("a") == pytest.approx(expected, abs=1e-12)
    assert ctl.distribution("a")[0] == pytest.approx(0.0327161, abs=1e-6)
    # Intent b, state 0: S = 1, N = 1, pooled from a: (0.5 + 1) / (1 + 2) = 0.5.
    assert ctl.pass_rates("b")[0] == pytest.approx((1 + 2 * 0.5) / 3)


def test_it_floors_a_mastered_state_at_a_min() -> None:
    ctl = CurriculumController(["x"], CurriculumConfig(a_min=0.3, c_ucb=0.0, epsilon=0.1))
    for _ in range(10):
        ctl.update("x", ALL_STATES[5], [1.0])
    # Single intent: pooled = (0 + 1) / (0 + 2) = 1/2; p^ = (10 + 2 * 0.5) / 12 = 11/12;
    # B = 1 - 2 * 5/12 = 1/6 < A_min = 0.3; every other state has B = 1.
    assert ctl.pass_rates("x")[5] == pytest.approx(11 / 12)
    assert ctl.allocation_scores("x")[5] == pytest.approx(0.3)
    assert ctl.distribution("x")[5] == pytest.approx(0.9 * 0.3 / (0.3 + 23) + 0.1 / 24)


def test_it_applies_the_temperature_as_a_power_one_over_gamma() -> None:
    ctl = CurriculumController(
        ["x"], CurriculumConfig(a_min=0.3, c_ucb=0.0, gamma=0.5, epsilon=0.0)
    )
    for _ in range(10):
        ctl.update("x", ALL_STATES[5], [1.0])
    # A^(1/gamma) = A^2: 0.09 for state 5 and 1 for the rest; no rehearsal.
    assert ctl.distribution("x")[5] == pytest.approx(0.09 / (0.09 + 23))


def test_it_counts_a_reward_equal_to_eta_as_a_pass() -> None:
    ctl = CurriculumController(["x"], CurriculumConfig(eta=0.7))
    ctl.update("x", ALL_STATES[1], [0.7, 0.69999, 0.8, 0.1])  # y = 1, 0, 1, 0
    assert ctl.snapshot()["intents"]["x"]["passes"][1] == 0.5
    assert ctl.snapshot()["intents"]["x"]["groups"][1] == 1


def test_it_pools_only_other_intents_evidence() -> None:
    ctl = CurriculumController(["a", "b", "c"], CFG)
    for _ in range(3):
        ctl.update("a", ALL_STATES[2], [0.0])  # a fails at state 2
    ctl.update("b", ALL_STATES[2], [1.0])
    ctl.update("c", ALL_STATES[2], [1.0])
    # For a: pooled from b and c only: (2 + 1) / (2 + 2) = 3/4; own S = 0, N = 3.
    assert ctl.pass_rates("a")[2] == pytest.approx((0 + 2 * 0.75) / (3 + 2))
    # For b: pooled from a (0/3) and c (1/1): (1 + 1) / (4 + 2) = 1/3.
    assert ctl.pass_rates("b")[2] == pytest.approx((1 + 2 / 3) / (1 + 2))


def test_it_selects_by_inverse_cdf_with_the_given_rng() -> None:
    ctl = CurriculumController(["x"], CFG)
    ctl.update("x", ALL_STATES[7], [1.0, 0.0])
    probs = ctl.distribution("x")
    u = np.random.default_rng(11).random()
    expected = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    assert ctl.select("x", np.random.default_rng(11)) is ALL_STATES[expected]


def test_it_reports_a_json_ready_snapshot() -> None:
    ctl = CurriculumController(["a", "b"])
    ctl.update("a", ALL_STATES[3], [0.2])
    snap = json.loads(json.dumps(ctl.snapshot()))
    assert snap["total_groups"] == 1
    assert snap["states"][3] == ALL_STATES[3].key
    assert snap["intents"]["a"]["groups"][3] == 1
    assert sum(snap["intents"]["b"]["allocation"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0}, {"lam": -1}, {"c_ucb": -0.1}, {"a_min": 0}, {"gamma": 0},
     {"epsilon": 1.5}, {"eta": math.nan}],
)  # fmt: skip
def test_it_refuses_bad_config(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        CurriculumConfig(**kwargs)


def test_it_refuses_bad_updates_and_intents() -> None:
    ctl = CurriculumController(["a"])
    with pytest.raises(ValueError, match="unknown intent"):
        ctl.update("zz", ALL_STATES[0], [1.0])
    with pytest.raises(ValueError, match="InteractionState"):
        ctl.update("a", 3, [1.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        ctl.update("a", ALL_STATES[0], [])
    with pytest.raises(ValueError, match="finite"):
        ctl.update("a", ALL_STATES[0], [math.inf])
    with pytest.raises(ValueError, match="Generator"):
        ctl.select("a", 42)  # type: ignore[arg-type]
    for bad in ([], "ab", ["a", "a"], ["", "b"]):
        with pytest.raises(ValueError, match="intents"):
            CurriculumController(bad)


updates = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 23),
        st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=6),
    ),
    max_size=60,
)
configs = st.builds(
    CurriculumConfig,
    eta=st.floats(0, 1),
    alpha=st.floats(0.1, 10),
    lam=st.floats(0.1, 10),
    c_ucb=st.floats(0, 3),
    a_min=st.floats(0.01, 1),
    gamma=st.floats(0.2, 3),
    epsilon=st.floats(0, 1),
)


@settings(max_examples=150, deadline=None)
@given(updates, configs)
def test_it_always_yields_a_distribution_with_its_floors(history, config) -> None:  # type: ignore[no-untyped-def]
    ctl = CurriculumController(["a", "b", "c"], config)
    for intent, z, rewards in history:
        ctl.update(intent, ALL_STATES[z], rewards)
    for intent in ("a", "b", "c"):
        probs = ctl.distribution(intent)
        scores = ctl.allocation_scores(intent)
        assert probs.shape == (24,)
        assert probs.sum() == pytest.approx(1.0, abs=1e-9)
        assert all(0.0 <= p <= 1.0 for p in ctl.pass_rates(intent))
        assert min(scores) >= config.a_min
        weights = [a ** (1 / config.gamma) for a in scores]
        floor = (1 - config.epsilon) * config.a_min ** (1 / config.gamma) / sum(weights)
        assert probs.min() >= config.epsilon / 24 + floor - 1e-12
        # More evidence never raises the uncertainty bonus of a state.
        counts = ctl.snapshot()["intents"][intent]["groups"]
        bonus = [
            math.sqrt(math.log(sum(len(h) > 0 for h in history) + 1) / (n + 1)) for n in counts
        ]
        order = sorted(range(24), key=lambda z: counts[z])
        assert all(bonus[order[k]] >= bonus[order[k + 1]] for k in range(23))


@settings(max_examples=60, deadline=None)
@given(updates)
def test_it_ignores_the_order_of_updates(history) -> None:  # type: ignore[no-untyped-def]
    forward, backward = CurriculumController(["a", "b", "c"]), CurriculumController(["a", "b", "c"])
    for intent, z, rewards in history:
        forward.update(intent, ALL_STATES[z], rewards)
    for intent, z, rewards in reversed(history):
        backward.update(intent, ALL_STATES[z], rewards)
    for intent in ("a", "b", "c"):
        assert forward.distribution(intent) == pytest.approx(backward.distribution(intent))
