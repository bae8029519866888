"""What a server that died mid-reply leaves behind, and how the next server recovers.

A server process killed while writing a reply leaves (a) the client's message stored with
no reply and (b) the Redis mark "a reply is being written". These tests build exactly that
state on the real PostgreSQL and Redis and connect a fresh socket, as a reconnecting page
through another server would.
"""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async

from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until
from webapp.counseling.turns import ReplyLock, redis_client, reply_key
from webapp.lib import frames

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
CONTROL = r'id="control"'


def _orphaned_message():  # type: ignore[no-untyped-def]
    """A session whose last turn is a client message that never got its reply."""
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    session = services.start_session(profile.user)
    services.append_turn(session.pk, "client", "I feel anxious", client_msg_id="lost-1")
    return profile.user, session


async def test_it_offers_try_again_for_a_reply_a_dead_server_left_unwritten(tiny_engine):  # type: ignore[no-untyped-def]
    user, session = await sync_to_async(_orphaned_message)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", user)
    assert connected
    await comm.send_to(text_data=json.dumps({"type": "resync", "after_seq": -1}))
    await frames_until(comm, CONTROL)
    notice = await comm.receive_from(timeout=10)
    assert 'data-code="reply_interrupted"' in notice
    assert 'name="client_msg_id" value="lost-1"' in notice and 'value="retry"' in notice
    # Pressing it gets the reply, and the message is still stored once.
    await comm.send_to(text_data=json.dumps({"type": "retry", "client_msg_id": "lost-1"}))
    await frames_until(comm, r'class="turn turn-counselor"', wait=60)
    await comm.disconnect()
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "counselor"]


async def test_it_stays_quiet_while_another_server_is_writing_the_reply(tiny_engine):  # type: ignore[no-untyped-def]
    user, session = await sync_to_async(_orphaned_message)()
    await redis_client().set(reply_key(session.pk), "other-server", ex=30)
    try:
        comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", user)
        assert connected
        await comm.send_to(text_data=json.dumps({"type": "resync", "after_seq": -1}))
        await frames_until(comm, CONTROL)
        assert await comm.receive_nothing(timeout=1)
        await comm.disconnect()
    finally:
        await redis_client().delete(reply_key(session.pk))


async def test_a_reply_mark_is_a_short_lease_renewed_while_writing() -> None:
    lock = ReplyLock(987654321)
    assert await lock.acquire()
    try:
        ttl = await redis_client().ttl(lock.key)
        assert 0 < ttl <= ReplyLock.LEASE_SECONDS  # a dead writer's mark soon expires
        assert not await ReplyLock(987654321).acquire()  # a live one still excludes others
    finally:
        await lock.release()
    assert not await redis_client().exists(lock.key)


def test_an_unsaved_message_is_offered_back_with_its_text_and_id() -> None:
    frame = frames.error_frame(
        -1, "storage_unavailable", "Not saved.", retry_msg_id="m-7", resend_text='I "said" <this>'
    )
    assert 'name="type" value="message"' in frame
    assert 'name="client_msg_id" value="m-7"' in frame
    text = re.search(r'name="text" value="([^"]*)"', frame)
    assert text is not None and text.group(1) == "I &quot;said&quot; &lt;this&gt;"
