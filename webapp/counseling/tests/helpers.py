"""Shared pieces for socket tests: log a user in for Channels, read HTML frames."""

from __future__ import annotations

import asyncio
import contextlib
import re
from html import unescape

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from webapp.asgi import application


def login_cookie(user) -> tuple[bytes, str]:  # type: ignore[no-untyped-def]
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    assert store.session_key is not None
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}".encode(), store.session_key


async def connect(path: str, user) -> tuple[WebsocketCommunicator, bool, int | str, str]:  # type: ignore[no-untyped-def]
    cookie, key = await sync_to_async(login_cookie)(user)
    comm = WebsocketCommunicator(
        application,
        path,
        headers=[(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)],
    )
    connected, code = await comm.connect(timeout=10)
    if not connected:
        await end_refused(comm)
    return comm, connected, code, key


async def end_refused(comm: WebsocketCommunicator, *, wait: float = 10) -> None:
    """End a refused socket's application task the way daphne does, without hanging.

    daphne answers a close during the handshake with ``websocket.disconnect``; the consumer
    then stops by itself. Left pending, the task would be cancelled at event-loop teardown,
    and asgiref's ``wait`` awaits a cancelled task with no time limit.
    """
    with contextlib.suppress(Exception):
        await comm.send_input({"type": "websocket.disconnect", "code": 1006})
    app = comm.future
    done, _ = await asyncio.wait({app}, timeout=wait)
    if not done:
        app.cancel()
        await asyncio.wait({app}, timeout=wait)
    if app.done() and not app.cancelled():
        app.exception()  # retrieved: a refused socket's task may end with an error


async def frames_until(comm: WebsocketCommunicator, pattern: str, *, wait: float = 30) -> list[str]:
    """Receive frames until one matches ``pattern`` (regex); return them all."""
    seen: list[str] = []
    while True:
        frame = await comm.receive_from(timeout=wait)
        seen.append(frame)
        if re.search(pattern, frame):
            return seen


def token_texts(frames: list[str]) -> list[str]:
    out = []
    for frame in frames:
        m = re.search(r'<span id="pending-text"[^>]*>(.*?)</span>', frame, re.S)
        if m:
            out.append(unescape(m.group(1)))
    return out


def turn_texts(frames: list[str], role: str) -> list[str]:
    out = []
    for frame in frames:
        for m in re.finditer(
            rf'class="turn turn-{role}"[^>]*>.*?<p class="text">(.*?)</p>', frame, re.S
        ):
            out.append(unescape(re.sub(r"<br>", "\n", m.group(1))).strip())
    return out
