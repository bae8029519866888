"""Hypothesis against the chat socket's message parser, on the real stack.

Any frame a browser could send (any text; any JSON with any ``type``, ``text``,
``client_msg_id`` and ``after_seq``, escaped lone surrogates and NULs included) gets a
known answer: never a traceback, never ``internal_error``, never a dropped socket; a
refused frame stores nothing, and every stored turn is clean text. The AI is paused for
the client and the model backend cannot start (``broken_engine``), so no example waits
for generation: input handling is what is under test.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webapp.counseling.models import Turn
from webapp.oversight.models import ClientControl
from webapp.tests.security.conftest import build_world, ws_connect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]

# Every reason code the socket may give for a frame it refuses.
KNOWN_CODES = {
    "bad_json", "not_text", "unknown_type", "empty_message", "too_long", "busy",
    "bad_message_id", "nothing_to_retry", "session_closed", "reply_interrupted", "bad_text",
    "bad_seq",
}  # fmt: skip

# Text with every code point a JSON escape can carry: lone surrogates and controls too.
any_char = st.characters(codec=None, exclude_categories=())
loose_text = st.text(any_char, max_size=40)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | loose_text
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
KINDS = st.sampled_from(["message", "retry", "resync", "ping", "dance", ""]) | json_values


@st.composite
def frames(draw: st.DrawFn) -> str:
    """One text frame: a JSON object most of the time, sometimes any text at all."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.text(max_size=60))  # raw text (a real frame is valid UTF-8)
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["type"] = draw(KINDS)
    for key in ("text", "client_msg_id", "after_seq"):
        if draw(st.booleans()):
            doc[key] = draw(json_values | st.integers(min_value=-(2**70), max_value=2**70))
    if "text" not in doc and doc.get("type") in ("message", None):
        doc["text"] = draw(loose_text)
    # ensure_ascii: lone surrogates travel as \\udXXX escapes, as any client can send them;
    # allow_nan: Python's json reads NaN/Infinity, so a client can send them too.
    return json.dumps(doc, ensure_ascii=True, allow_nan=True)


async def _answers(comm: Any) -> list[dict[str, Any]]:
    """Everything the socket says until it has been quiet for a moment (every frame is
    answered, so the first wait is long and the rest short)."""
    out = []
    wait = 5.0
    while not await comm.receive_nothing(timeout=wait):  # (receive_output's timeout
        out.append(await comm.receive_output())  # would cancel the application)
        wait = 0.3
    return out


@pytest.fixture
async def paused_socket(adapter_dir: Any, settings: Any, broken_engine: Any):  # type: ignore[no-untyped-def]
    settings.WS_RATE_LIMIT = 100_000  # the flood limit has its own test
    world = await sync_to_async(build_world)(adapter_dir)
    await sync_to_async(ClientControl.objects.create)(client=world.client_a, ai_paused=True)
    comm, connected, _ = await ws_connect(f"/ws/sessions/{world.open_a.pk}/", world.client_a)
    assert connected
    yield world, comm
    await comm.disconnect()


async def test_any_frame_gets_a_known_answer_and_the_socket_stays_open(
    paused_socket: Any,
) -> None:
    """Hypothesis drives the examples from a worker thread and runs each on this test's
    event loop: the socket (and its application task) lives on that loop only."""
    world, comm = paused_socket
    loop = asyncio.get_running_loop()

    @settings(
        max_examples=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(frame=frames())
    @example(frame='{"type": "message", "text": "hi \\ud800", "client_msg_id": "a"}')
    @example(frame='{"type": "message", "text": "hi", "client_msg_id": "a\\u0000b"}')
    @example(frame='{"type": "message", "text": "hi", "client_msg_id": "\\udc00"}')
    @example(frame='{"type": "resync", "after_seq": Infinity}')
    @example(frame='{"type": "resync", "after_seq": NaN}')
    @example(frame='{"type": "resync", "after_seq": 1e300}')
    @example(frame='{"type": "resync", "after_seq": 99999999999999999999}')
    @example(frame='{"type": "resync", "after_seq": -7}')
    def check(frame: str) -> None:
        asyncio.run_coroutine_threadsafe(_check_one(world, comm, frame), loop).result()

    await asyncio.to_thread(check)


async def _check_one(world: Any, comm: Any, frame: str) -> None:
    count = Turn.objects.filter(session=world.open_a).acount
    before = await count()
    await comm.send_input({"type": "websocket.receive", "text": frame})  # "" included
    answers = await _answers(comm)
    assert answers, f"no answer to {frame!r}"
    codes: list[str] = []
    for out in answers:
        assert out["type"] == "websocket.send", f"socket closed on {frame!r}: {out}"
        text = out.get("text") or ""
        assert "Traceback" not in text
        codes += re.findall(r'data-code="([^"]*)"', text)
    for code in codes:
        assert code in KNOWN_CODES, f"{code} on {frame!r}"
    if codes and not any(code == "reply_interrupted" for code in codes):
        assert await count() == before, f"refused {frame!r} but stored a turn"
    texts = await sync_to_async(list)(
        Turn.objects.filter(session=world.open_a).values_list("text", flat=True)
    )
    for text in texts:
        assert "\x00" not in text
        text.encode("utf-8")  # storable and showable: no lone surrogates
