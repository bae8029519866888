"""Websocket limits on the real stack (PostgreSQL, the Redis channel layer).

Already covered in ``webapp/counseling/tests/test_consumer.py`` and not repeated here:
malformed JSON -> ``bad_json`` frame, a 70 kB frame -> 1009, a flood -> ``rate_limited``
frame then 1008, socket closed after its Django session row is deleted; and in
``webapp/tests/test_websocket_handshake.py``: foreign and missing Origin on the
notification socket. This module adds the boundaries and paths those leave open.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from webapp.tests.security.conftest import World, build_world, session_cookie, ws_connect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]


@pytest.fixture
async def world(adapter_dir: Any) -> World:
    return await sync_to_async(build_world)(adapter_dir)


def chat_path(world: World) -> str:
    return f"/ws/sessions/{world.open_a.pk}/"


async def finish(*comms: WebsocketCommunicator) -> None:
    """End the application task of a socket the server closed: a consumer runs on until
    the client's disconnect, and a pending one hangs the event loop's teardown."""
    for comm in comms:
        with contextlib.suppress(Exception):
            await comm.disconnect(timeout=5)


async def outputs_until_close(comm: WebsocketCommunicator) -> list[dict[str, Any]]:
    seen = []
    while True:
        out = await comm.receive_output(timeout=10)
        seen.append(out)
        if out["type"] == "websocket.close":
            return seen


# -- Origin ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "origin",
    [None, b"https://evil.example.com", b"http://localhost.evil.com", b"null", b""],
    ids=["missing", "foreign", "lookalike", "null", "empty"],
)
@pytest.mark.parametrize("path", ["chat", "notifications"])
async def test_it_refuses_a_foreign_or_missing_origin(world: World, origin, path) -> None:  # type: ignore[no-untyped-def]
    target = chat_path(world) if path == "chat" else "/ws/notifications/"
    _, connected, _ = await ws_connect(target, world.client_a, origin=origin)
    assert not connected


async def test_the_same_user_with_our_origin_is_accepted(world: World) -> None:
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    await comm.disconnect()


# -- frame size --------------------------------------------------------------------------
def _frame_of(size: int) -> str:
    """A JSON ping of exactly ``size`` UTF-8 bytes."""
    base = json.dumps({"type": "ping", "pad": ""})
    return json.dumps({"type": "ping", "pad": "x" * (size - len(base))})


async def test_a_frame_of_exactly_64_kib_is_accepted_one_byte_more_closes_1009(
    world: World,
) -> None:
    limit = settings.WS_MAX_FRAME_BYTES
    assert limit == 64 * 1024
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    await comm.send_to(text_data=_frame_of(limit))
    assert 'id="status"' in await comm.receive_from(timeout=10)  # the ping's answer
    await comm.send_to(text_data=_frame_of(limit + 1))
    assert await comm.receive_output(timeout=10) == {"type": "websocket.close", "code": 1009}
    await finish(comm)


async def test_an_oversized_binary_frame_closes_1009(world: World) -> None:
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    await comm.send_to(bytes_data=b"\0" * (settings.WS_MAX_FRAME_BYTES + 1))
    assert await comm.receive_output(timeout=10) == {"type": "websocket.close", "code": 1009}
    await finish(comm)


async def test_a_multibyte_frame_is_measured_in_bytes_not_characters(world: World) -> None:
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    # 30,000 characters, 90,000 bytes: over the limit although short in characters.
    await comm.send_to(
        text_data=json.dumps({"type": "ping", "pad": "€" * 30_000}, ensure_ascii=False)
    )
    assert await comm.receive_output(timeout=10) == {"type": "websocket.close", "code": 1009}
    await finish(comm)


# -- malformed input keeps the socket open and says why ------------------------------------
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("[1, 2]", "bad_json"),
        ("42", "bad_json"),
        ('"text"', "bad_json"),
        ("null", "bad_json"),
        ('{"type": "message"', "bad_json"),
        ("\ufeff{}", "bad_json"),
        (b"\x80\x81", "not_text"),
    ],
)
async def test_malformed_frames_get_an_error_frame_with_a_reason_code(
    world: World, frame: str | bytes, code: str
) -> None:
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    if isinstance(frame, bytes):
        await comm.send_to(bytes_data=frame)
    else:
        await comm.send_to(text_data=frame)
    answer = await comm.receive_from(timeout=10)
    assert f'data-code="{code}"' in answer and "Traceback" not in answer
    await comm.send_json_to({"type": "ping"})  # still open and answering
    assert 'id="status"' in await comm.receive_from(timeout=10)
    await comm.disconnect()


async def test_a_flood_gets_the_rate_limit_frame_before_the_1008_close(
    world: World, settings: Any
) -> None:
    settings.WS_RATE_LIMIT = 5
    comm, connected, _ = await ws_connect(chat_path(world), world.client_a)
    assert connected
    for _ in range(settings.WS_RATE_LIMIT + 1):
        await comm.send_json_to({"type": "ping"})
    outputs = await outputs_until_close(comm)
    codes = [o.get("text", "") for o in outputs[:-1]]
    assert outputs[-1] == {"type": "websocket.close", "code": 1008}
    assert 'data-code="rate_limited"' in codes[-1]  # the last thing said before the close
    await finish(comm)


# -- logout and account disable close open sockets ----------------------------------------
async def _open_both(world: World, user: Any) -> tuple[Any, Any, str]:
    """A chat socket and a notification socket sharing one log-in; returns its key."""
    from webapp.asgi import application

    cookie, key = await sync_to_async(session_cookie)(user)
    socks = []
    for path in (chat_path(world), "/ws/notifications/"):
        headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
        comm = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await comm.connect(timeout=10)
        assert connected, path
        socks.append(comm)
    return socks[0], socks[1], key


async def _closed(comm: WebsocketCommunicator) -> dict[str, Any]:
    while True:  # skip frames broadcast on join (a clinician's "joined" notice)
        out = await comm.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            return out


@pytest.mark.parametrize("who", ["client_a", "clinician_a"])
async def test_logout_closes_every_open_socket_of_that_login(
    world: World, settings: Any, who: str
) -> None:
    settings.WS_REAUTH_SECONDS = 0.2  # production: 30 s, within the 60 s promised
    user = world.users[who]
    chat, notes, key = await _open_both(world, user)

    def log_out() -> int:
        client = Client()
        client.cookies[settings.SESSION_COOKIE_NAME] = key
        return client.post("/logout/").status_code

    assert await sync_to_async(log_out)() == 302
    assert await _closed(chat) == {"type": "websocket.close", "code": 4401}
    assert await _closed(notes) == {"type": "websocket.close", "code": 4401}
    await finish(chat, notes)


async def test_disabling_an_account_closes_its_idle_sockets(world: World, settings: Any) -> None:
    settings.WS_REAUTH_SECONDS = 0.2
    chat, notes, _ = await _open_both(world, world.client_a)
    user = world.client_a
    user.is_active = False
    await sync_to_async(user.save)()
    assert await _closed(chat) == {"type": "websocket.close", "code": 4401}
    assert await _closed(notes) == {"type": "websocket.close", "code": 4401}
    await finish(chat, notes)


def test_the_production_recheck_interval_is_within_60_seconds() -> None:
    from webapp import settings as production

    assert production.WS_REAUTH_SECONDS <= 60


# -- refused handshakes do not leak Redis connections ---------------------------------------
