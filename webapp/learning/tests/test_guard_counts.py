"""Guard rejections per adapter version in the simulation lab's summary (issue 21)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.tests.factories import ClinicianFactory
from webapp.learning import simreport
from webapp.learning.models import CandidateGroup, SimulationRun
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


def test_the_simulation_page_shows_rejections_per_version(client) -> None:  # type: ignore[no-untyped-def]
    version = make_version("v7", "training")
    make_groups(1, adapter_version=version, guard=[REJECTED, PASSED, PASSED])
    groups = make_groups(1, guard=[PASSED, PASSED, PASSED])
    sessions = list(CandidateGroup.objects.values_list("session_id", flat=True))
    run = SimulationRun.objects.create(
        status="succeeded", finished_at=timezone.now(), report_path="/tmp/run",
        report={"guard": simreport.guard_summary(sessions)},
    )  # fmt: skip
    client.force_login(ClinicianFactory())
    page = client.get(reverse("learning:simulation", args=[run.pk])).content.decode()
    text = re.sub(r"<[^>]+>", " ", page)
    assert re.search(r"v7\s+3\s+1 \(33", text) and "identity.credential 1" in text
    assert re.search(r"base model\s+3\s+0 \(0", text)
    assert groups[0].session_id in sessions


def test_the_approval_page_shows_each_side_by_side_replys_guard_verdict(client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = {
        "passed": False,
        "checks": [{"name": "output_guard", "passed": False,
                    "detail": "candidate 1/1 replies rejected vs parent 0/1"}],
        "side_by_side": [{
            "id": "cbt-stuck", "source": "project", "modality": "cbt",
            "prompt": [{"role": "user", "content": "I feel stuck."}],
            "parent": "Tell me more.", "candidate": "As a licensed therapist, I see it.",
            "guard": {"parent": [], "candidate": ["identity.credential"]},
        }],
    }  # fmt: skip
    version = make_version("v9", "failed", validation_report=report)
    client.force_login(ClinicianFactory())
    page = client.get(reverse("learning:adapter", args=[version.pk])).content.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    assert "output_guard failed candidate 1/1 replies rejected vs parent 0/1" in text
    assert "Output guard: passed" in text
    assert "Output guard: rejected (identity.credential)" in text
