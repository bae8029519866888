"""Clinician actions on a client: pause or resume the AI, acknowledge flags.

Each action is audited and announced live to the client's open session (any server
process), so the client always sees who they are talking to.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webapp.accounts.models import User
from webapp.counseling.models import Session
from webapp.lib import audit, frames
from webapp.lib.groups import session_group
from webapp.oversight.models import ClientControl, SafetyFlag

log = logging.getLogger(__name__)


class OversightError(ValueError):
    """A clinician action that cannot be taken; the message says why."""


def broadcast_to_session(session_id: int, html: str) -> None:
    try:
        async_to_sync(get_channel_layer().group_send)(
            session_group(session_id), {"type": "chat.frame", "html": html}
        )
    except Exception as exc:  # Redis down: the state is saved; pages catch up on resync
        log.warning("could not announce to session %s: %s", session_id, exc)


def set_ai_paused(clinician: User, client: User, paused: bool) -> ClientControl:
    with transaction.atomic():
        control, _ = ClientControl.objects.select_for_update().get_or_create(client=client)
        control.ai_paused = paused
        control.paused_by = clinician if paused else None
        control.paused_at = timezone.now() if paused else None
        control.save()
        audit.record(clinician, "ai.pause" if paused else "ai.resume", subject=client)
        session = Session.objects.filter(client=client, status=Session.Status.OPEN).first()
        if session is not None:
            html = frames.control_frame(-1, paused=paused, clinician_present=paused)
            transaction.on_commit(lambda: broadcast_to_session(session.pk, html))
    return control


def acknowledge(clinician: User, flag_id: int) -> SafetyFlag:
    with transaction.atomic():
        # The assigned clinician, or the second clinician the flag was escalated to.
        flag = (
            SafetyFlag.objects.select_for_update(of=("self",))
            .filter(
                Q(client__client_profile__clinician=clinician) | Q(escalated_to=clinician),
                pk=flag_id,
            )
            .first()
        )
        if flag is None:
            raise OversightError("No such flag.")
        if flag.acknowledged_at is None:
            flag.acknowledged_at = timezone.now()
            flag.acknowledged_by = clinician
            flag.save(update_fields=["acknowledged_at", "acknowledged_by"])
            audit.record(
                clinician, "flag.acknowledge", subject=flag.client, target=f"flag:{flag.pk}"
            )
        return flag
