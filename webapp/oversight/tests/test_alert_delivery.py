"""Crisis alert e-mails keep trying across runs, and the ones that cannot go out are seen.

The delivery task runs once a minute (beat). These tests run it by hand and move a row's
``next_attempt_at`` into the past where a later run would have come.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.core.mail import get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection, transaction
from django.utils import timezone

from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.oversight import alerts, tasks
from webapp.oversight.models import AlertOutbox, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


class MailServerDown(BaseEmailBackend):
    def send_messages(self, messages):  # type: ignore[no-untyped-def]
        raise ConnectionRefusedError(111, "Connection refused")


@pytest.fixture(autouse=True)
def quiet(monkeypatch):  # type: ignore[no-untyped-def]
    """No live pushes or queued tasks (no worker runs here)."""
    monkeypatch.setattr(alerts, "notify_user", lambda *a: None)
    monkeypatch.setattr(alerts, "_queue_delivery", lambda: None)
    monkeypatch.setattr(alerts, "queue_check", lambda *a, **kw: None)


def _alert(*, email: str = "dr.ames@clinic.example") -> AlertOutbox:
    profile = client_profile()
    profile.clinician.email = email
    profile.clinician.save()
    session = make_session(profile, open_=True)
    flag = SafetyFlag.objects.create(
        client=profile.user, session=session, turn=session.turns.first(), level="crisis"
    )
    return AlertOutbox.objects.create(flag=flag, recipient=profile.clinician)


def _due(row: AlertOutbox) -> None:
    AlertOutbox.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())


def test_a_failed_send_is_tried_again_in_a_later_run_with_growing_waits(settings) -> None:  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = f"{__name__}.MailServerDown"
    row = _alert()
    assert tasks.deliver_alerts() == 0
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 1)
    assert "Connection refused" in row.last_error
    first_wait = (row.next_attempt_at - timezone.now()).total_seconds()
    assert 25 < first_wait <= 30

    tasks.deliver_alerts()  # the same run's loop, or the next minute: not due yet
    row.refresh_from_db()
    assert row.attempts == 1

    _due(row)
    tasks.deliver_alerts()
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 2)
    assert 55 < (row.next_attempt_at - timezone.now()).total_seconds() <= 60

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    _due(row)
    assert tasks.deliver_alerts() == 1
    row.refresh_from_db()
    assert row.status == "sent" and row.attempts == 3
    assert mail.outbox[-1].to == ["dr.ames@clinic.example"]


def test_an_alert_that_failed_every_try_is_shown_and_escalated(settings, client) -> None:  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = f"{__name__}.MailServerDown"
    second = ClinicianFactory(email="dr.bell@clinic.example")
    row = _alert()
    AlertOutbox.objects.filter(pk=row.pk).update(attempts=tasks.MAX_ATTEMPTS - 1)
    tasks.deliver_alerts()
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("failed", tasks.MAX_ATTEMPTS)
    flag = SafetyFlag.objects.get(pk=row.flag_id)
    assert flag.escalated_to == second
    assert AlertOutbox.objects.filter(flag=flag, recipient=second, status="pending").exists()

    client.force_login(row.recipient)
    page = client.get("/clinician/").content.decode()
    assert 'id="alert-delivery"' in page and f'data-outbox="{row.pk}"' in page
    assert "Connection refused" in page
    admin = AdminFactory()
    client.force_login(admin)
    page = client.get("/console/").content.decode()
    assert f'data-outbox="{row.pk}"' in page

    SafetyFlag.objects.filter(pk=flag.pk).update(acknowledged_at=timezone.now())
    assert f'data-outbox="{row.pk}"' not in client.get("/console/").content.decode()


def test_a_clinician_without_an_email_address_is_a_visible_configuration_error(
    settings, client
) -> None:  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    row = _alert(email="")
    tasks.deliver_alerts()
    row.refresh_from_db()
    assert row.status == "failed" and "no e-mail address" in row.last_error
    assert not any("@localhost" in to for m in mail.outbox for to in m.to)

    client.force_login(row.recipient)
    page = client.get("/clinician/").content.decode()
    assert 'data-code="no_email"' in page and f'data-outbox="{row.pk}"' in page
    admin = AdminFactory()
    client.force_login(admin)
    page = client.get("/console/").content.decode()
    assert 'data-code="no_email"' in page and row.recipient.username in page


def test_the_smtp_connection_gives_up_after_email_timeout() -> None:
    assert get_connection("django.core.mail.backends.smtp.EmailBackend").timeout == 10


class FlagLockedElsewhere(BaseEmailBackend):
    """While the alert is being sent, a clinician acknowledges its flag (another
    connection locks the flag row, NOWAIT: it fails if the delivery holds that lock)."""

    outcome: list[str] = []

    def send_messages(self, messages):  # type: ignore[no-untyped-def]
        flag_id = FlagLockedElsewhere.flag_id  # type: ignore[attr-defined]

        def acknowledge() -> None:
            try:
                with transaction.atomic():
                    SafetyFlag.objects.select_for_update(nowait=True).get(pk=flag_id)
                FlagLockedElsewhere.outcome.append("locked the flag")
            except Exception as exc:
                FlagLockedElsewhere.outcome.append(type(exc).__name__)
            finally:
                connection.close()

        worker = threading.Thread(target=acknowledge)
        worker.start()
        worker.join(10)
        return len(messages)


@pytest.mark.django_db(transaction=True)
def test_sending_an_alert_locks_only_its_outbox_row(settings) -> None:  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = f"{__name__}.FlagLockedElsewhere"
    row = _alert()
    FlagLockedElsewhere.flag_id = row.flag_id  # type: ignore[attr-defined]
    FlagLockedElsewhere.outcome = []
    assert tasks.deliver_alerts() == 1
    assert FlagLockedElsewhere.outcome == ["locked the flag"]


def test_waits_grow_and_stop_growing_at_an_hour() -> None:
    waits = [tasks.backoff_seconds(n) for n in range(1, 10)]
    assert waits[:3] == [30.0, 60.0, 120.0]
    assert waits == sorted(waits) and max(waits) == 3600.0
    assert timedelta(seconds=sum(waits[: tasks.MAX_ATTEMPTS - 1])) < timedelta(hours=1)


def test_alerts_queue_the_tasks_by_their_registered_names() -> None:
    assert tasks.deliver_alerts.name == alerts.DELIVER_TASK
    assert tasks.escalate_flag.name == alerts.ESCALATE_TASK
