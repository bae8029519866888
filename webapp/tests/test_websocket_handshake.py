"""The websocket stack refuses foreign origins and anonymous users (real Redis layer)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from webapp.accounts.tests.factories import UserFactory
from webapp.asgi import application
from webapp.counseling.tests.helpers import end_refused
from webapp.lib.groups import user_group

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]


def session_cookie_for(user) -> bytes:  # type: ignore[no-untyped-def]
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}".encode()


def communicator(origin: bytes | None, cookie: bytes | None = None) -> WebsocketCommunicator:
    headers = [(b"host", b"localhost")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/notifications/", headers=headers)


def test_the_channel_layer_is_redis() -> None:
    assert type(get_channel_layer()).__name__ == "RedisChannelLayer"


async def test_it_refuses_a_foreign_origin() -> None:
    user = await sync_to_async(UserFactory)()
    cookie = await sync_to_async(session_cookie_for)(user)
    comm = communicator(b"https://evil.example.com", cookie)
    connected, _ = await comm.connect()
    assert not connected
    await end_refused(comm)


async def test_it_refuses_a_missing_origin() -> None:
    comm = communicator(None)
    connected, _ = await comm.connect()
    assert not connected
    await end_refused(comm)


async def test_it_refuses_an_anonymous_user() -> None:
    comm = communicator(b"http://localhost")
    connected, code = await comm.connect()
    assert not connected
    assert code == 4401
    await end_refused(comm)


async def test_it_accepts_a_logged_in_user_and_delivers_group_messages() -> None:
    user = await sync_to_async(UserFactory)()
    cookie = await sync_to_async(session_cookie_for)(user)
    comm = communicator(b"http://localhost", cookie)
    connected, _ = await comm.connect()
    assert connected
    await get_channel_layer().group_send(
        user_group(user.pk), {"type": "notify", "payload": {"kind": "hello", "text": "<b>hi</b>"}}
    )
    frame = await comm.receive_from(timeout=5)
    assert 'data-kind="hello"' in frame and "&lt;b&gt;hi&lt;/b&gt;" in frame
    await comm.disconnect()


async def test_it_stops_forwarding_to_a_disabled_user() -> None:
    user = await sync_to_async(UserFactory)()
    cookie = await sync_to_async(session_cookie_for)(user)
    comm = communicator(b"http://localhost", cookie)
    connected, _ = await comm.connect()
    assert connected
    user.is_active = False
    await sync_to_async(user.save)()
    await get_channel_layer().group_send(
        user_group(user.pk), {"type": "notify", "payload": {"secret": 1}}
    )
    output = await comm.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": 4403}
