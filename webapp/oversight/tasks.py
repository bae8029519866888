"""Celery tasks of the oversight app."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from webapp.oversight.models import AlertOutbox

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5


@shared_task(acks_late=True, reject_on_worker_lost=True)
def deliver_alerts(limit: int = 50) -> int:
    """Email pending crisis alerts. Each row is claimed with SKIP LOCKED so two workers
    never send the same alert; a failure leaves it pending for the next run."""
    sent = 0
    for _ in range(limit):
        with transaction.atomic():
            row = (
                AlertOutbox.objects.select_for_update(skip_locked=True)
                .filter(status=AlertOutbox.Status.PENDING)
                .select_related("flag__client", "recipient")
                .order_by("created_at")
                .first()
            )
            if row is None:
                break
            row.attempts += 1
            flag = row.flag
            subject = f"[PsyEvo] {flag.level.upper()} flag for client {flag.client.username}"
            body = (
                f"A message from client {flag.client.username} was assessed as {flag.level} "
                f"({', '.join(flag.categories) or 'unspecified'}) at {flag.created_at:%Y-%m-%d %H:%M %Z}.\n"
                f"Open your dashboard to review and acknowledge it. Message text is not included "
                f"in email for privacy."
            )
            try:
                send_mail(
                    subject,
                    body,
                    settings.DEFAULT_FROM_EMAIL,
                    [row.recipient.email or f"{row.recipient.username}@localhost"],
                )
            except Exception as exc:
                row.last_error = str(exc)[:500]
                if row.attempts >= MAX_ATTEMPTS:
                    row.status = AlertOutbox.Status.FAILED
                    log.error("alert %s failed %s times: %s", row.pk, row.attempts, exc)
                row.save(update_fields=["attempts", "last_error", "status"])
                continue
            row.status = AlertOutbox.Status.SENT
            row.sent_at = timezone.now()
            row.save(update_fields=["attempts", "status", "sent_at"])
            sent += 1
    return sent


@shared_task(acks_late=True, reject_on_worker_lost=True)
def escalate_flag(flag_id: int) -> bool:
    """Scheduled with a countdown when a crisis flag is raised: escalate it to a second
    clinician if it is still unacknowledged (idempotent; see ``escalation``)."""
    from webapp.oversight import escalation

    return escalation.escalate(flag_id) is not None


@shared_task(acks_late=True, reject_on_worker_lost=True)
def escalate_overdue_flags() -> int:
    """Backstop for lost countdown tasks: escalate every overdue crisis flag. Safe to run
    from a periodic schedule or by hand."""
    from webapp.oversight import escalation

    return escalation.escalate_overdue()
