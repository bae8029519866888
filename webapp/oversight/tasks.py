"""Celery tasks of the oversight app."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from webapp.oversight import escalation
from webapp.oversight.models import AlertOutbox

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 6
BACKOFF_FIRST_SECONDS = 30.0
BACKOFF_MAX_SECONDS = 3600.0


def backoff_seconds(attempts: int) -> float:
    """The wait after ``attempts`` failed tries: 30 s, doubling, at most an hour (six
    tries span about 15 minutes, across as many runs of the once-a-minute task)."""
    return min(BACKOFF_FIRST_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_MAX_SECONDS)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def deliver_alerts(limit: int = 50) -> int:
    """Email the crisis alerts that are due, ONE try per alert per run.

    A failed send waits ``backoff_seconds`` (``next_attempt_at``) for a later run, so a
    mail server that is down for a few minutes does not use up every try at once. After
    ``MAX_ATTEMPTS`` tries, or at once when the recipient has no e-mail address (a
    configuration error, never a guessed address), the row is ``failed``: it shows on the
    clinician dashboard and the admin console, and the flag escalates to a second
    clinician. Each row is claimed with SKIP LOCKED, locking the outbox row only (not the
    flag a clinician may be acknowledging, nor the users), so two workers never send the
    same alert."""
    sent = 0
    for _ in range(limit):
        with transaction.atomic():
            row = (
                AlertOutbox.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(status=AlertOutbox.Status.PENDING, next_attempt_at__lte=timezone.now())
                .select_related("flag__client", "recipient")
                .order_by("next_attempt_at", "created_at")
                .first()
            )
            if row is None:
                break
            _try(row)
        if row.status == AlertOutbox.Status.SENT:
            sent += 1
        elif row.status == AlertOutbox.Status.FAILED:
            _gave_up(row)
    return sent


def _try(row: AlertOutbox) -> None:
    row.attempts += 1
    flag = row.flag
    address = row.recipient.email.strip()
    if not address:
        row.status = AlertOutbox.Status.FAILED
        row.last_error = f"configuration error: {row.recipient.username} has no e-mail address"
        row.save(update_fields=["attempts", "last_error", "status"])
        return
    subject = f"[PsyEvo] {flag.level.upper()} flag for client {flag.client.username}"
    body = (
        f"A message from client {flag.client.username} was assessed as {flag.level} "
        f"({', '.join(flag.categories) or 'unspecified'}) at {flag.created_at:%Y-%m-%d %H:%M %Z}.\n"
        f"Open your dashboard to review and acknowledge it. Message text is not included "
        f"in email for privacy."
    )
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [address])
    except Exception as exc:
        row.last_error = str(exc)[:500]
        if row.attempts >= MAX_ATTEMPTS:
            row.status = AlertOutbox.Status.FAILED
        else:
            row.next_attempt_at = timezone.now() + timedelta(seconds=backoff_seconds(row.attempts))
            log.warning("alert %s: try %s failed, next at %s: %s", row.pk, row.attempts,
                        row.next_attempt_at, exc)  # fmt: skip
        row.save(update_fields=["attempts", "last_error", "status", "next_attempt_at"])
        return
    row.status = AlertOutbox.Status.SENT
    row.sent_at = timezone.now()
    row.save(update_fields=["attempts", "status", "sent_at"])


def _gave_up(row: AlertOutbox) -> None:
    """An alert nobody will receive by e-mail: escalate its flag (a no-op when it is
    acknowledged or escalated already) and say so loudly."""
    log.critical("alert %s for flag %s failed after %s tries: %s", row.pk, row.flag_id,
                 row.attempts, row.last_error)  # fmt: skip
    try:
        escalation.escalate(row.flag_id)
    except Exception:
        log.exception("flag %s could not be escalated after its alert failed", row.flag_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def escalate_flag(flag_id: int) -> bool:
    """Scheduled with a countdown when a crisis flag is raised: escalate it to a second
    clinician if it is still unacknowledged (idempotent; see ``escalation``)."""
    return escalation.escalate(flag_id) is not None


@shared_task(acks_late=True, reject_on_worker_lost=True)
def escalate_overdue_flags() -> int:
    """Backstop for lost countdown tasks: escalate every overdue crisis flag. Safe to run
    from a periodic schedule or by hand."""
    return escalation.escalate_overdue()
