"""Crisis flags nobody acknowledged within the delay go to a second clinician."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from counselor_engine.safety import assess
from webapp.accounts.tests.factories import ClinicianFactory
from webapp.oversight import alerts, escalation, tasks
from webapp.oversight.models import AlertOutbox, AuditEvent, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def pushed(monkeypatch):  # type: ignore[no-untyped-def]
    """Live notifications and queued deliveries, recorded instead of sent."""
    sent: list[tuple[int, dict]] = []
    monkeypatch.setattr(
        alerts, "notify_user", lambda user_id, payload: sent.append((user_id, payload))
    )
    monkeypatch.setattr(alerts, "_queue_delivery", lambda: None)
    return sent


@pytest.fixture
def scheduled(monkeypatch):  # type: ignore[no-untyped-def]
    """Escalation checks queued by task name, recorded instead of sent."""
    calls: list[dict] = []

    def send_task(name, **kw):  # type: ignore[no-untyped-def]
        assert name == tasks.escalate_flag.name
        calls.append(kw)

    monkeypatch.setattr(alerts.current_app, "send_task", send_task)
    return calls


def crisis_flag(profile, *, minutes_ago: int = 6):  # type: ignore[no-untyped-def]
    session = make_session(profile, open_=True)
    flag = SafetyFlag.objects.create(
        client=profile.user, session=session, turn=session.turns.first(), level="crisis"
    )
    SafetyFlag.objects.filter(pk=flag.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    flag.refresh_from_db()
    return flag


def test_raising_a_crisis_flag_schedules_the_escalation(
    settings, scheduled, pushed, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    settings.PSYEVO_ESCALATION_SECONDS = 240
    profile = client_profile()
    session = make_session(profile, open_=True)
    with django_capture_on_commit_callbacks(execute=True):
        flag = alerts.raise_flag(session.pk, session.turns.first(), assess("I want to kill myself"))
    assert flag.level == "crisis"
    assert scheduled == [{"args": [flag.pk], "countdown": 240}]


def test_a_concern_is_not_escalated(scheduled, pushed, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile, open_=True)
    assessment = assess("I feel hopeless lately")
    assert assessment.level == "concern"
    with django_capture_on_commit_callbacks(execute=True):
        alerts.raise_flag(session.pk, session.turns.first(), assessment)
    assert scheduled == []


def test_without_an_assigned_clinician_it_escalates_at_once(
    scheduled, pushed, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    profile = client_profile(clinician=None)
    session = make_session(profile, open_=True)
    with django_capture_on_commit_callbacks(execute=True):
        flag = alerts.raise_flag(session.pk, session.turns.first(), assess("I want to kill myself"))
    assert scheduled == [{"args": [flag.pk], "countdown": 0}]


def test_an_unacknowledged_flag_goes_to_a_second_clinician(
    pushed, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    profile = client_profile()
    second = ClinicianFactory()
    flag = crisis_flag(profile)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.escalate_flag.apply(args=[flag.pk]).get() is True
    flag.refresh_from_db()
    assert flag.escalated_to == second and flag.escalated_at is not None
    assert AlertOutbox.objects.filter(flag=flag, recipient=second).exists()
    event = AuditEvent.objects.get(action="flag.escalate")
    assert (event.actor, event.subject, event.target) == (None, profile.user, f"flag:{flag.pk}")
    assert event.detail["to"] == second.username and event.detail["unacknowledged_seconds"] >= 300
    assert [(uid, p["kind"]) for uid, p in pushed] == [(second.pk, "escalation")]
    assert profile.user.username in pushed[0][1]["text"]

    # Idempotent: a second delivery of the task changes nothing.
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.escalate_flag.apply(args=[flag.pk]).get() is False
    assert AlertOutbox.objects.filter(flag=flag).count() == 1
    assert AuditEvent.objects.filter(action="flag.escalate").count() == 1


def test_an_acknowledged_flag_is_left_alone(pushed):  # type: ignore[no-untyped-def]
    profile = client_profile()
    ClinicianFactory()
    flag = crisis_flag(profile)
    SafetyFlag.objects.filter(pk=flag.pk).update(
        acknowledged_at=timezone.now(), acknowledged_by=profile.clinician
    )
    assert escalation.escalate(flag.pk) is None
    flag.refresh_from_db()
    assert flag.escalated_to is None and not AlertOutbox.objects.exists()


def test_the_second_clinician_is_the_least_recently_escalated_to(pushed):  # type: ignore[no-untyped-def]
    assigned = ClinicianFactory()
    profile = client_profile(clinician=assigned)
    busy, idle = ClinicianFactory(), ClinicianFactory()
    ClinicianFactory(is_active=False)
    older = crisis_flag(client_profile(clinician=assigned))
    SafetyFlag.objects.filter(pk=older.pk).update(escalated_to=busy, escalated_at=timezone.now())
    first = escalation.escalate(crisis_flag(profile).pk)
    assert first is not None and first.escalated_to == idle  # never escalated to: first
    # Now both have one escalation; `busy` has the older one, so it is next.
    sibling = client_profile(clinician=assigned)
    second = escalation.escalate(crisis_flag(sibling).pk)
    assert second is not None and second.escalated_to == busy


def test_never_the_assigned_clinician_and_none_when_nobody_else(pushed, caplog):  # type: ignore[no-untyped-def]
    profile = client_profile()
    flag = crisis_flag(profile)
    assert escalation.escalate(flag.pk) is None
    assert "no second clinician" in caplog.text
    flag.refresh_from_db()
    assert flag.escalated_to is None


def test_the_backstop_escalates_only_overdue_flags(settings, pushed):  # type: ignore[no-untyped-def]
    settings.PSYEVO_ESCALATION_SECONDS = 300
    ClinicianFactory()
    overdue = crisis_flag(client_profile(), minutes_ago=10)
    fresh = crisis_flag(client_profile(), minutes_ago=1)
    assert tasks.escalate_overdue_flags.apply().get() == 1
    overdue.refresh_from_db()
    fresh.refresh_from_db()
    assert overdue.escalated_to is not None and fresh.escalated_to is None
