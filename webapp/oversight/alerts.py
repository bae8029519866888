"""Crisis and concern flags: stored, pushed live to the clinician, emailed via an outbox.

The live push goes through the channel layer to the clinician's notification socket
(any server process); the email goes through an outbox row that a Celery task drains,
so a down mail server or worker delays the email but never loses it.

Tasks are queued by name: ``webapp.oversight.tasks`` runs this module's and
``escalation``'s code, so importing it here would make a circle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from asgiref.sync import async_to_sync
from celery import current_app
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import Q

from counselor_engine.safety import SafetyAssessment
from webapp.accounts.models import ClientProfile, Role, User
from webapp.counseling.models import Session, Turn
from webapp.lib.groups import user_group
from webapp.oversight.models import AlertOutbox, SafetyFlag

log = logging.getLogger(__name__)

DELIVER_TASK = "webapp.oversight.tasks.deliver_alerts"
ESCALATE_TASK = "webapp.oversight.tasks.escalate_flag"


def notify_user(user_id: int, payload: dict[str, object]) -> None:
    """Push a JSON payload to every open page of one user, on any server process."""
    try:
        async_to_sync(get_channel_layer().group_send)(
            user_group(user_id), {"type": "notify", "payload": payload}
        )
    except Exception as exc:  # Redis down: the flag and outbox row still exist
        log.warning("live notification to user %s failed: %s", user_id, exc)


def raise_flag(session_id: int, turn: Turn, assessment: SafetyAssessment) -> SafetyFlag:
    """Store the flag and its alert rows; push and queue them once the transaction commits."""
    with transaction.atomic():
        session = Session.objects.select_related("client").get(pk=session_id)
        flag, dispatch = store_flag(session, turn, assessment)
        for step in dispatch:
            transaction.on_commit(step)
        return flag


def store_flag(
    session: Session, turn: Turn, assessment: SafetyAssessment
) -> tuple[SafetyFlag, list[Callable[[], None]]]:
    """Write the flag and its email outbox row in the caller's transaction.

    Returns the steps that tell people about it (live push, delivery task, escalation
    check), to run after the commit. The caller decides when: the turn API runs them after
    the safe reply has gone out, because with Redis or the broker down each step takes
    seconds to give up, and the rows are what make the flag durable, not the pushes."""
    flag = SafetyFlag.objects.create(
        client=session.client,
        session=session,
        turn=turn,
        level=assessment.level,
        categories=list(assessment.categories),
        matched=list(assessment.matched),
    )
    profile = ClientProfile.objects.filter(user=session.client).select_related("clinician").first()
    clinician = profile.clinician if profile else None
    dispatch: list[Callable[[], None]] = []
    if clinician is not None:
        if assessment.level == "crisis":
            AlertOutbox.objects.create(flag=flag, recipient=clinician)
        payload = {
            "kind": "safety_flag",
            "flag": flag.pk,
            "level": flag.level,
            "client": session.client.username,
            "session": session.pk,
            "categories": flag.categories,
        }
        dispatch.append(lambda: notify_user(clinician.pk, payload))
    else:
        log.error(
            "safety flag %s for client %s has no assigned clinician", flag.pk, session.client_id
        )
    if assessment.level == "crisis":
        # Unacknowledged after the delay -> a second clinician (at once if none is
        # assigned): see webapp.oversight.escalation.
        flag_id, now = flag.pk, clinician is None
        dispatch += [_queue_delivery, lambda: queue_check(flag_id, immediately=now)]
    return flag, dispatch


def _queue_delivery() -> None:
    try:
        current_app.send_task(DELIVER_TASK)
    except Exception as exc:  # broker down: the outbox row waits for the next drain
        log.warning("could not queue alert delivery: %s", exc)


def delay_seconds() -> int:
    """How long a crisis flag waits for its clinician before it is escalated."""
    return int(getattr(settings, "PSYEVO_ESCALATION_SECONDS", 300))


def queue_check(flag_id: int, *, immediately: bool = False) -> None:
    """Queue the escalation check of a new crisis flag now (after the flag's commit)."""
    countdown = 0 if immediately else delay_seconds()
    try:
        current_app.send_task(ESCALATE_TASK, args=[flag_id], countdown=countdown)
    except Exception as exc:  # broker down: escalate_overdue picks the flag up later
        log.warning("could not schedule escalation of flag %s: %s", flag_id, exc)


def failed_deliveries(*, clinician: User | None = None) -> list[AlertOutbox]:
    """Alert e-mails that failed all their tries (or could not be sent: no address) for
    flags nobody has acknowledged yet; for one clinician, those addressed to them or
    about their clients."""
    rows = AlertOutbox.objects.filter(
        status=AlertOutbox.Status.FAILED, flag__acknowledged_at__isnull=True
    ).select_related("flag__client", "recipient")
    if clinician is not None:
        rows = rows.filter(
            Q(recipient=clinician) | Q(flag__client__client_profile__clinician=clinician)
        )
    return list(rows.order_by("-created_at")[:50])


def clinicians_without_email() -> list[User]:
    """Active clinicians no crisis alert can reach by e-mail: a configuration error."""
    return list(
        User.objects.filter(role=Role.CLINICIAN, is_active=True, email="").order_by("username")
    )
