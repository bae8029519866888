"""HBSP: Eq. 3 probabilities, Eq. 4 updates, the Eq. 11 identity and the client posterior."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.hbsp import (
    Decision,
    SkillPosterior,
    posterior_update,
    skill_probabilities,
)
from counselor_engine.skills import PriorTable, skills_for

STATE = "core/middle/anxiety"
CBT = [s.id for s in skills_for("cbt")]
values = st.floats(-5, 5, allow_nan=False)


def _q(value: float = 0.2) -> dict[str, float]:
    return dict.fromkeys(CBT, value)


# --- Eq. 3 -------------------------------------------------------------------------------


def test_probabilities_follow_eq3() -> None:
    q, b = np.array([0.5, 0.2, 0.0]), np.array([0.1, -0.3, 0.4])
    expected = 0.95 * np.exp(q + b) / np.exp(q + b).sum() + 0.05 / 3
    assert skill_probabilities(q, b) == pytest.approx(expected)


def test_tau_multiplies_the_scores() -> None:
    q, b = np.array([1.0, 0.0]), np.zeros(2)
    sharp = skill_probabilities(q, b, tau=2.0, epsilon=0.0)
    assert sharp[0] == pytest.approx(math.exp(2) / (math.exp(2) + 1))
    assert skill_probabilities(q, b, tau=0.0).tolist() == [0.5, 0.5]


def test_large_scores_do_not_overflow() -> None:
    p = skill_probabilities([1000.0, 0.0], [0.0, 0.0], epsilon=0.0)
    assert p.tolist() == [1.0, 0.0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(values, values, st.booleans()), min_size=1, max_size=12),
    st.floats(0, 10),
    st.floats(0, 1),
)
def test_probabilities_sum_to_one_and_invalid_skills_get_zero(
    rows: list[tuple[float, float, bool]], tau: float, epsilon: float
) -> None:
    q, b, valid = (np.array(column) for column in zip(*rows, strict=True))
    if not valid.any():
        valid[0] = True
    p = skill_probabilities(q, b, tau=tau, epsilon=epsilon, valid=valid)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert (p[~valid] == 0.0).all()
    assert (p[valid] >= epsilon / valid.sum() - 1e-15).all()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"shared_values": [0.1, math.nan], "draws": [0, 0]}, "shared_values"),
        ({"shared_values": [0.1, 0.2], "draws": [0, math.inf]}, "draws"),
        ({"shared_values": [0.1, 0.2], "draws": [0]}, "draws"),
        ({"shared_values": [], "draws": []}, "shared_values"),
        ({"shared_values": [0.1], "draws": [0], "epsilon": 1.5}, "epsilon"),
        ({"shared_values": [0.1], "draws": [0], "epsilon": math.nan}, "epsilon"),
        ({"shared_values": [0.1], "draws": [0], "tau": -1.0}, "tau"),
        ({"shared_values": [0.1], "draws": [0], "valid": [False]}, "valid"),
        ({"shared_values": [0.1], "draws": [0], "valid": [1]}, "valid"),
    ],
)
def test_probabilities_refuse_bad_input(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        skill_probabilities(**kwargs)  # type: ignore[arg-type]


# --- Eq. 4 and Eq. 11 --------------------------------------------------------------------


def test_posterior_update_follows_eq4() -> None:
    assert posterior_update(0.0, 4.0, 1.0) == pytest.approx((0.2, 5.0))
    mean, precision = posterior_update(0.5, 2.0, -1.0, obs_variance=0.5)
    assert precision == 4.0 and mean == pytest.approx((2.0 * 0.5 + 2.0 * -1.0) / 4.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        ((0.0, 0.0, 1.0), {}, "precision"),
        ((0.0, -1.0, 1.0), {}, "precision"),
        ((math.nan, 4.0, 1.0), {}, "mean"),
        ((0.0, 4.0, math.inf), {}, "residual"),
        ((0.0, 4.0, 1.0), {"obs_variance": 0.0}, "obs_variance"),
    ],
)
def test_posterior_update_refuses_bad_input(
    args: tuple[float, float, float], kwargs: dict[str, float], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        posterior_update(*args, **kwargs)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1), st.lists(st.floats(-3, 3), min_size=1, max_size=30))
def test_n_updates_give_the_eq11_interpolation(q: float, returns: list[float]) -> None:
    posterior = SkillPosterior()
    for G in returns:
        posterior.update(STATE, "CBT3", G, q)
    n = len(returns)
    cell = posterior.cell(STATE, "CBT3")
    assert cell.n == n and cell.precision == pytest.approx(4.0 + n)
    prior_weight = 4.0 / (4.0 + n)
    expected = prior_weight * q + (1 - prior_weight) * (sum(returns) / n)
    assert q + cell.mean == pytest.approx(expected, abs=1e-9)


# --- SkillPosterior ----------------------------------------------------------------------


def test_new_cells_start_at_the_prior() -> None:
    cell = SkillPosterior().cell(STATE, "CBT1")
    assert (cell.mean, cell.precision, cell.n, cell.sd) == (0.0, 4.0, 0, 0.5)


def test_decide_records_every_valid_skill() -> None:
    valid = ["CBT1", "CBT3", "CBT4"]  # the clinician excluded the others
    decision = SkillPosterior().decide(STATE, valid, _q(), np.random.default_rng(0))
    assert list(decision.records) == valid and decision.chosen in valid
    assert sum(r.probability for r in decision.records.values()) == pytest.approx(1.0)
    record = decision.records["CBT3"]
    assert (record.mean, record.sd, record.shared_value) == (0.0, 0.5, 0.2)
    assert not decision.pinned


def test_decide_uses_the_recorded_draws_in_eq3() -> None:
    posterior = SkillPosterior()
    posterior.update(STATE, "CBT2", 1.0, 0.3)
    q = {s: 0.1 * k for k, s in enumerate(CBT)}
    decision = posterior.decide(STATE, CBT, q, np.random.default_rng(7))
    draws = [decision.records[s].draw for s in CBT]
    expected = skill_probabilities([q[s] for s in CBT], draws)
    assert [decision.records[s].probability for s in CBT] == pytest.approx(expected.tolist())
    assert decision.records["CBT2"].mean == posterior.cell(STATE, "CBT2").mean


def test_decide_is_reproducible_with_the_same_seed() -> None:
    posterior = SkillPosterior()
    first = posterior.decide(STATE, CBT, _q(), np.random.default_rng(42))
    second = posterior.decide(STATE, CBT, _q(), np.random.default_rng(42))
    assert first == second


def test_draws_follow_the_posterior() -> None:
    posterior = SkillPosterior()
    for _ in range(12):
        posterior.update(STATE, "CBT1", 1.5, 0.5)  # precision 16, sd 0.25
    rng = np.random.default_rng(3)
    draws = [posterior.decide(STATE, CBT, _q(), rng).records["CBT1"].draw for _ in range(3000)]
    cell = posterior.cell(STATE, "CBT1")
    assert np.mean(draws) == pytest.approx(cell.mean, abs=0.02)
    assert np.std(draws) == pytest.approx(0.25, abs=0.02)


def test_choices_follow_the_probabilities() -> None:
    posterior = SkillPosterior(prior_precision=1e12)  # draws ~ 0: fixed probabilities
    q = {s: float(k) for k, s in enumerate(CBT)}
    rng = np.random.default_rng(11)
    chosen = [posterior.decide(STATE, CBT, q, rng).chosen for _ in range(4000)]
    frequencies = np.array([chosen.count(s) for s in CBT]) / len(chosen)
    expected = skill_probabilities(list(q.values()), np.zeros(6))
    assert frequencies == pytest.approx(expected, abs=0.03)


def test_a_pin_forces_the_skill() -> None:
    decision = SkillPosterior().decide(STATE, CBT, _q(), np.random.default_rng(0), pinned="CBT5")
    assert decision.chosen == "CBT5" and decision.pinned
    assert {s: r.probability for s, r in decision.records.items()} == {
        s: float(s == "CBT5") for s in CBT
    }


def test_decide_accepts_a_prior_table_row() -> None:
    table = PriorTable.load_default()
    decision = SkillPosterior().decide(
        STATE, CBT, table.for_state("cbt", STATE), np.random.default_rng(1)
    )
    assert decision.records["CBT2"].shared_value == table.value("cbt", STATE, "CBT2")


@pytest.mark.parametrize(
    ("state", "valid", "table", "pinned", "name"),
    [
        ("core/middle/joy", CBT, _q(), None, "state"),
        (STATE, ["CBT1", "CBT9"], _q(), None, "valid_skills"),
        (STATE, [], _q(), None, "valid_skills"),
        (STATE, ["CBT1", "CBT1"], _q(), None, "valid_skills"),
        (STATE, ["CBT1", "BT1"], {**_q(), "BT1": 0.1}, None, "valid_skills"),
        (STATE, ["CBT1", "CBT2"], {"CBT1": 0.1}, None, "shared_table"),
        (STATE, ["CBT1", "CBT2"], {"CBT1": 0.1, "CBT2": math.nan}, None, "shared_table"),
        (STATE, ["CBT1", "CBT2"], _q(), "CBT3", "pinned"),
    ],
)
def test_decide_refuses_bad_input(
    state: str, valid: list[str], table: dict[str, float], pinned: str | None, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        SkillPosterior().decide(state, valid, table, np.random.default_rng(0), pinned=pinned)


def test_decide_needs_a_numpy_generator() -> None:
    with pytest.raises(ValueError, match="rng"):
        SkillPosterior().decide(STATE, CBT, _q(), 42)  # type: ignore[arg-type]


def test_update_changes_only_its_cell_and_reports_the_change() -> None:
    posterior = SkillPosterior()
    posterior.update("core/late/sadness", "CBT1", 0.4, 0.1)
    change = posterior.update(STATE, "CBT2", 1.2, 0.2)
    assert change.residual == pytest.approx(1.0)
    assert (change.mean_before, change.precision_before) == (0.0, 4.0)
    assert change.mean_after == pytest.approx(0.2)
    assert (change.precision_after, change.n) == (5.0, 1)
    assert set(posterior.cells()) == {("core/late/sadness", "CBT1"), (STATE, "CBT2")}
    assert posterior.cell(STATE, "CBT1").n == 0
    assert json.loads(json.dumps(change.to_dict()))["G"] == 1.2


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("core/middle/joy", "CBT1", 1.0, 0.2), "state"),
        ((STATE, "XYZ1", 1.0, 0.2), "skill"),
        ((STATE, "CBT1", math.nan, 0.2), "G"),
        ((STATE, "CBT1", 1.0, math.inf), "shared_value"),
    ],
)
def test_update_refuses_bad_input(args: tuple[str, str, float, float], name: str) -> None:
    posterior = SkillPosterior()
    with pytest.raises(ValueError, match=name):
        posterior.update(*args)
    assert posterior.cells() == {}


def test_the_posterior_round_trips_through_json() -> None:
    posterior = SkillPosterior()
    posterior.update(STATE, "CBT2", 0.9, 0.2)
    posterior.update("formulation/early/guilt", "CBT1", 0.1, 0.3)
    stored = json.loads(json.dumps(posterior.to_dict()))
    again = SkillPosterior.from_dict(stored)
    assert again.cells() == posterior.cells()
    assert [c["state"] for c in stored["cells"]] == ["formulation/early/guilt", STATE]


@pytest.mark.parametrize(
    "cell",
    [
        {"state": STATE, "skill": "CBT1", "mean": 0.0, "precision": 0.0, "n": 1},
        {"state": STATE, "skill": "CBT1", "mean": math.nan, "precision": 4.0, "n": 1},
        {"state": "nowhere", "skill": "CBT1", "mean": 0.0, "precision": 4.0, "n": 1},
        {"state": STATE, "skill": "CBT0", "mean": 0.0, "precision": 4.0, "n": 1},
    ],
)
def test_from_dict_refuses_bad_cells(cell: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="data"):
        SkillPosterior.from_dict({"format": 1, "cells": [cell]})


def test_a_decision_round_trips_through_json() -> None:
    decision = SkillPosterior().decide(STATE, CBT, _q(), np.random.default_rng(5))
    stored = json.loads(json.dumps(decision.to_dict()))
    assert Decision.from_dict(stored) == decision
    assert set(stored["records"]["CBT1"]) == {"probability", "mean", "sd", "draw", "shared_value"}
