"""Sockets end when the browser's log-in would end over HTTP: expiry, a password change,
the staff idle timeout, withdrawn review consent; the periodic re-check survives a
database error. Real stack: channels, Redis channel layer, PostgreSQL."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session as DjangoSession
from django.db import OperationalError
from django.utils import timezone

from webapp.accounts.middleware import LAST_SEEN_KEY
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import consumers, services
from webapp.counseling.tests.helpers import connect, frames_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
CLOSED = {"type": "websocket.close", "code": 4401}


@pytest.fixture(autouse=True)
def _fast_recheck(settings):  # type: ignore[no-untyped-def]
    settings.WS_REAUTH_SECONDS = 0.2


def _client_session():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


def _set_last_seen(key: str, when: float) -> None:
    """As the idle middleware records the last HTTP request of a staff member."""
    store = SessionStore(session_key=key)
    store[LAST_SEEN_KEY] = when
    store.save()


async def _open(user, path):  # type: ignore[no-untyped-def]
    comm, connected, code, key = await connect(path, user)
    assert connected, code
    return comm, key


async def test_a_password_change_closes_the_clients_socket(tiny_engine):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client_session)()
    comm, _ = await _open(profile.user, f"/ws/sessions/{session.pk}/")

    def change() -> None:
        profile.user.set_password("a completely new passphrase")
        profile.user.save()

    await sync_to_async(change)()
    assert await comm.receive_output(timeout=5) == CLOSED
    await comm.disconnect()


async def test_an_expired_session_closes_the_socket_though_its_row_remains(tiny_engine):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client_session)()
    comm, key = await _open(profile.user, f"/ws/sessions/{session.pk}/")
    past = timezone.now() - timedelta(seconds=1)
    await sync_to_async(DjangoSession.objects.filter(session_key=key).update)(expire_date=past)
    assert await comm.receive_output(timeout=5) == CLOSED
    assert await sync_to_async(DjangoSession.objects.filter(session_key=key).exists)()
    await comm.disconnect()


async def test_the_staff_idle_timeout_closes_the_clinicians_alert_socket(settings):  # type: ignore[no-untyped-def]
    settings.STAFF_IDLE_TIMEOUT_SECONDS = 60
    profile = await sync_to_async(ClientProfileFactory)()
    comm, key = await _open(profile.clinician, "/ws/notifications/")

    await sync_to_async(_set_last_seen)(key, time.time() - 30)
    assert await comm.receive_nothing(timeout=1)  # within the limit: still open
    await sync_to_async(_set_last_seen)(key, time.time() - 61)
    assert await comm.receive_output(timeout=5) == CLOSED
    await comm.disconnect()


async def test_a_clinician_writing_in_a_live_session_is_not_idle(tiny_engine, settings):  # type: ignore[no-untyped-def]
    settings.STAFF_IDLE_TIMEOUT_SECONDS = 60
    profile, session = await sync_to_async(_client_session)()
    comm, key = await _open(profile.clinician, f"/ws/sessions/{session.pk}/")
    await sync_to_async(_set_last_seen)(key, time.time() - 50)
    await comm.send_to(
        text_data=json.dumps(
            {"type": "message", "text": "I am here with you", "client_msg_id": "c1"}
        )
    )
    await frames_until(comm, r'class="turn turn-clinician"')
    seen = await sync_to_async(lambda: SessionStore(session_key=key).load()[LAST_SEEN_KEY])()
    assert time.time() - seen < 5
    await comm.disconnect()


async def test_withdrawn_review_consent_refuses_and_closes_the_clinicians_session_socket(
    tiny_engine,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client_session)()
    comm, _ = await _open(profile.clinician, f"/ws/sessions/{session.pk}/")
    await sync_to_async(profile.consents.create)(purpose="clinician_review", granted=False)
    while (out := await comm.receive_output(timeout=5))["type"] != "websocket.close":
        pass  # the join notice went to the group first
    assert out == CLOSED
    await comm.disconnect()
    _, connected, code, _ = await connect(f"/ws/sessions/{session.pk}/", profile.clinician)
    assert not connected and code == consumers.CLOSE_NOT_FOUND
    client_comm, _ = await _open(profile.user, f"/ws/sessions/{session.pk}/")  # theirs still
    await client_comm.disconnect()


async def test_the_recheck_survives_a_database_error_and_still_closes_after_logout(
    tiny_engine,
    monkeypatch,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client_session)()
    comm, key = await _open(profile.user, f"/ws/sessions/{session.pk}/")
    real = consumers.login_still_valid
    failures = {"left": 3}

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(consumers, "login_still_valid", flaky)
    assert await comm.receive_nothing(timeout=1.0)  # three failed checks: still open
    assert failures["left"] == 0
    await sync_to_async(DjangoSession.objects.filter(session_key=key).delete)()
    assert await comm.receive_output(timeout=5) == CLOSED
    await comm.disconnect()
