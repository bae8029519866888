"""Guard rejections per adapter version in the simulation lab's summary (issue 21)."""

from __future__ import annotations

import pytest

from webapp.learning import simreport
from webapp.learning.tests.helpers import make_groups, make_version

pytestmark = pytest.mark.django_db

REJECTED = {"admitted": False, "rules": ["identity.credential"], "reason": "x"}
PASSED = {"admitted": True, "rules": [], "reason": ""}


def test_it_counts_rejections_per_generating_version() -> None:
    version = make_version("v7", "training")
    base = make_groups(2, guard=[PASSED, PASSED, REJECTED])
    tuned = make_groups(
        2, adapter_version=version, guard=[REJECTED, REJECTED, {**REJECTED, "rules": ["advice.medication"]}],
        delivered=None, admissible=False, buffer_status="excluded",
    )  # fmt: skip
    sessions = [base[0].session_id, tuned[0].session_id]
    summary = simreport.guard_summary(sessions)
    assert summary["base model"] == {
        "turns": 2, "candidates": 6, "rejected": 2, "rejection_rate": 2 / 6, "fallbacks": 0,
        "by_rule": {"identity.credential": 2},
    }  # fmt: skip
    assert summary["v7"]["rejected"] == 6 and summary["v7"]["fallbacks"] == 2
    assert summary["v7"]["by_rule"] == {"advice.medication": 2, "identity.credential": 4}
    # Only the run's own sessions are counted.
    assert set(simreport.guard_summary([base[0].session_id])) == {"base model"}


def test_groups_stored_before_the_guard_count_as_checked_by_nothing() -> None:
    groups = make_groups(1)  # no verdicts stored (evidence older than issue 21)
    summary = simreport.guard_summary([groups[0].session_id])
    assert summary["base model"]["candidates"] == 0
    assert summary["base model"]["rejection_rate"] is None
