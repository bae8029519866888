"""Clinician oversight of a live session: alerts, joining, pausing and resuming the AI."""

from __future__ import annotations

import json
import logging

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse

from webapp.accounts.tests.factories import (
    ClientProfileFactory,
    ClinicianFactory,
    grant_all_consents,
)
from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until, turn_texts
from webapp.oversight.models import AuditEvent, ClientControl, SafetyFlag

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]


def client_with_session():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


def test_the_dashboard_lists_open_alerts_and_live_sessions(client):  # type: ignore[no-untyped-def]
    profile, session = client_with_session()
    turn, _ = services.append_turn(session.pk, "client", "I want to die", client_msg_id="x")
    SafetyFlag.objects.create(client=profile.user, session=session, turn=turn, level="crisis")
    client.force_login(profile.clinician)
    page = client.get(reverse("clinician_home")).content.decode()
    assert "CRISIS" in page and profile.user.username in page
    assert reverse("live_session", args=[session.pk]) in page
    assert 'ws-connect="/ws/notifications/"' in page


def test_acknowledging_a_flag_is_recorded_and_audited(client):  # type: ignore[no-untyped-def]
    profile, session = client_with_session()
    turn, _ = services.append_turn(session.pk, "client", "I want to die", client_msg_id="x")
    flag = SafetyFlag.objects.create(
        client=profile.user, session=session, turn=turn, level="crisis"
    )
    client.force_login(profile.clinician)
    response = client.post(reverse("acknowledge_flag", args=[flag.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Acknowledged by" in response.content.decode()
    flag.refresh_from_db()
    assert flag.acknowledged_by == profile.clinician
    assert AuditEvent.objects.filter(action="flag.acknowledge", subject=profile.user).exists()


def test_another_clinicians_flag_and_session_are_404(client, caplog):  # type: ignore[no-untyped-def]
    profile, session = client_with_session()
    turn, _ = services.append_turn(session.pk, "client", "help", client_msg_id="x")
    flag = SafetyFlag.objects.create(
        client=profile.user, session=session, turn=turn, level="concern"
    )
    client.force_login(ClinicianFactory())
    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        assert client.get(reverse("live_session", args=[session.pk])).status_code == 404
        assert client.post(reverse("pause_ai", args=[profile.user.pk])).status_code == 404
        assert client.post(reverse("acknowledge_flag", args=[flag.pk])).status_code == 404
    assert len([r for r in caplog.records if "not assigned" in r.getMessage()]) == 3
    assert not ClientControl.objects.filter(client=profile.user).exists()


def test_clients_never_reach_clinician_pages(client):  # type: ignore[no-untyped-def]
    profile, session = client_with_session()
    client.force_login(profile.user)
    assert client.get(reverse("live_session", args=[session.pk])).status_code == 403
    assert client.post(reverse("pause_ai", args=[profile.user.pk])).status_code == 403


async def test_joining_pausing_and_resuming_are_visible_to_the_client(tiny_engine, client):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(client_with_session)()
    client_sock, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    clinician_sock, connected, _, _ = await connect(
        f"/ws/sessions/{session.pk}/", profile.clinician
    )
    assert connected
    frames = await frames_until(client_sock, r'id="control"')
    assert "Your clinician has joined" in frames[-1]
    assert await sync_to_async(AuditEvent.objects.filter(action="session.join").exists)()

    await sync_to_async(client.force_login)(profile.clinician)
    await sync_to_async(client.post)(reverse("pause_ai", args=[profile.user.pk]))
    frames = await frames_until(client_sock, r"paused the AI counselor")
    await client_sock.send_to(
        text_data=json.dumps({"type": "message", "text": "hello?", "client_msg_id": "h"})
    )
    await frames_until(client_sock, r"turn-client")
    await clinician_sock.send_to(
        text_data=json.dumps({"type": "message", "text": "I'm here, Sam.", "client_msg_id": "c"})
    )
    frames = await frames_until(client_sock, r"turn-clinician")
    assert turn_texts(frames, "clinician") == ["I'm here, Sam."]
    turn = await sync_to_async(Turn.objects.get)(session=session, role="clinician")
    assert turn.author_id == profile.clinician.pk

    await sync_to_async(client.post)(reverse("resume_ai", args=[profile.user.pk]))
    await client_sock.send_to(
        text_data=json.dumps({"type": "message", "text": "thanks", "client_msg_id": "t"})
    )
    frames = await frames_until(client_sock, r'class="turn turn-counselor"')
    actions = await sync_to_async(list)(AuditEvent.objects.values_list("action", flat=True))
    assert {"ai.pause", "ai.resume", "session.join"} <= set(actions)
    await client_sock.disconnect()
    await clinician_sock.disconnect()
