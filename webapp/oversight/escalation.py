"""Escalation of crisis flags nobody acknowledged in time.

When a crisis flag is raised, a Celery task is scheduled ``PSYEVO_ESCALATION_SECONDS``
later (default 300; at once when the client has no assigned clinician). If the flag is
still unacknowledged then, it goes to a second clinician, chosen by this rule:

1. active users with role clinician, other than the client's assigned clinician;
2. the one least recently escalated to (never escalated to comes first), so escalations
   rotate over the team;
3. then the one with the fewest assigned clients, then the lowest id (deterministic).

The escalation sets ``escalated_to``/``escalated_at``, adds an outbox row (email), pushes
a live notice to the second clinician's open pages and writes an audit event. It is
idempotent: the flag row is locked and an acknowledged or already escalated flag is left
alone, so a repeated or duplicated task does nothing. ``escalate_overdue`` is the backstop
for a task that was lost (broker down when the flag was raised).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, OuterRef, Subquery
from django.utils import timezone

from webapp.accounts.models import ClientProfile, Role, User
from webapp.lib import audit
from webapp.oversight import alerts
from webapp.oversight.models import AlertOutbox, SafetyFlag

log = logging.getLogger(__name__)


def pick_second_clinician(flag: SafetyFlag) -> User | None:
    """The rule in the module docstring."""
    assigned = (
        ClientProfile.objects.filter(user_id=flag.client_id)
        .values_list("clinician_id", flat=True)
        .first()
    )
    last_escalation = (
        SafetyFlag.objects.filter(escalated_to=OuterRef("pk"))
        .order_by("-escalated_at")
        .values("escalated_at")[:1]
    )
    candidates = (
        User.objects.filter(role=Role.CLINICIAN, is_active=True)
        .exclude(pk=assigned or 0)
        .annotate(last=Subquery(last_escalation), load=Count("assigned_clients"))
        # Nulls first: a clinician never escalated to comes before everyone else.
        .order_by(F("last").asc(nulls_first=True), "load", "pk")
    )
    return candidates.first()


def escalate(flag_id: int, *, min_age_seconds: int = 0) -> SafetyFlag | None:
    """Escalate one flag if it still needs it; returns the flag when escalated now."""
    with transaction.atomic():
        flag = (
            SafetyFlag.objects.select_for_update()
            .select_related("client")
            .filter(pk=flag_id)
            .first()
        )
        if flag is None or flag.level != "crisis":
            return None
        if flag.acknowledged_at is not None or flag.escalated_to_id is not None:
            return None  # answered in time, or another run got there first
        if timezone.now() - flag.created_at < timedelta(seconds=min_age_seconds):
            return None
        second = pick_second_clinician(flag)
        if second is None:
            log.error("flag %s is unacknowledged and there is no second clinician", flag.pk)
            return None
        flag.escalated_to = second
        flag.escalated_at = timezone.now()
        flag.save(update_fields=["escalated_to", "escalated_at"])
        AlertOutbox.objects.create(flag=flag, recipient=second)
        waited = int((flag.escalated_at - flag.created_at).total_seconds())
        audit.record(
            None,
            "flag.escalate",
            subject=flag.client,
            target=f"flag:{flag.pk}",
            to=second.username,
            unacknowledged_seconds=waited,
        )
        payload = {
            "kind": "escalation",
            "flag": flag.pk,
            "text": (
                f"Escalated to you: a {flag.level.upper()} flag for client "
                f"{flag.client.username} was not acknowledged for {waited // 60} min. "
                "Reload your dashboard to review and acknowledge it."
            ),
        }
        transaction.on_commit(lambda: alerts.notify_user(second.pk, payload))
        transaction.on_commit(alerts._queue_delivery)
        return flag


def escalate_overdue(limit: int = 100) -> int:
    """Escalate every crisis flag left unacknowledged past the delay (the backstop)."""
    cutoff = timezone.now() - timedelta(seconds=alerts.delay_seconds())
    ids = list(
        SafetyFlag.objects.filter(
            level="crisis",
            acknowledged_at__isnull=True,
            escalated_to__isnull=True,
            created_at__lte=cutoff,
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(escalate(pk, min_age_seconds=alerts.delay_seconds()) is not None for pk in ids)
