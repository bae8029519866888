"""Every client message meets the safety net first (issue 17), on the real stack: the
websocket through Channels, the Redis channel layer and reply lock, PostgreSQL, the tiny
in-code model.

``held_model`` holds the model's generation until the test lets it go: the reply is then
"being written" for as long as the test needs (45 s in graph mode on the real model), and
what a second tab does meanwhile is what a person in two tabs would do.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from asgiref.sync import sync_to_async

from counselor_engine import safety
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import runtime, services, turns
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.helpers import connect, frames_until, turn_texts
from webapp.learning.models import CandidateGroup
from webapp.lib.groups import session_group
from webapp.oversight.models import SafetyFlag

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
DONE = r'class="turn turn-counselor"'
WRITING = r'id="pending" hx-swap-oob="innerHTML" data-seq'
CRISIS = "honestly I am done, I have the pills counted out and I am taking them tonight"
BOUND_S = 2.0


class Gate:
    """The model waits at ``release`` once it has ``started`` a generation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()


@pytest.fixture
async def held_model(tiny_engine, monkeypatch):  # type: ignore[no-untyped-def]
    gate = Gate()
    generate, stream = runtime.LazyBackend.generate, runtime.LazyBackend.generate_stream

    async def held_generate(self, prompt, **kwargs):  # type: ignore[no-untyped-def]
        gate.started.set()
        await gate.release.wait()
        return await generate(self, prompt, **kwargs)

    async def held_stream(self, prompt, **kwargs):  # type: ignore[no-untyped-def]
        gate.started.set()
        await gate.release.wait()
        async for event in stream(self, prompt, **kwargs):
            yield event

    monkeypatch.setattr(runtime.LazyBackend, "generate", held_generate)
    monkeypatch.setattr(runtime.LazyBackend, "generate_stream", held_stream)
    yield gate
    gate.release.set()


def _client():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


def send(comm, **data):  # type: ignore[no-untyped-def]
    return comm.send_to(text_data=json.dumps(data))


async def frames_for(comm, seconds: float) -> list[str]:  # type: ignore[no-untyped-def]
    """Every frame that arrives within ``seconds`` of quiet."""
    seen = []
    while not await comm.receive_nothing(timeout=seconds):
        seen.append(await comm.receive_from())
    return seen


@sync_to_async
def transcript(session) -> list[tuple[int, str, int | None, str]]:  # type: ignore[no-untyped-def]
    return [
        (t.seq, t.role, t.in_reply_to, t.safety_level)
        for t in Turn.objects.filter(session=session).order_by("seq")
    ]


async def _superseded(session, seconds: float = 5) -> list[int]:  # type: ignore[no-untyped-def]
    """The client turns whose reply was superseded, as the audit log records them."""
    from webapp.oversight.models import AuditEvent

    for _ in range(int(seconds / 0.05)):
        rows = await sync_to_async(list)(
            AuditEvent.objects.filter(action="turn.superseded", target=f"session:{session.pk}")
        )
        if rows:
            return sorted(r.detail["turn"] for r in rows)
        await asyncio.sleep(0.05)
    return []


async def _tabs(profile, session, n: int = 2):  # type: ignore[no-untyped-def]
    socks = []
    for _ in range(n):
        comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
        assert connected
        socks.append(comm)
    return socks


async def test_a_crisis_from_a_second_tab_mid_reply_gets_the_safe_reply_at_once(held_model):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    watch, connected, _, _ = await connect("/ws/notifications/", profile.clinician)
    assert connected
    tab1, tab2 = await _tabs(profile, session)
    await send(tab1, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(tab1, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)

    started = time.monotonic()
    await send(tab2, type="message", text=CRISIS, client_msg_id="c1")
    mine = await frames_until(tab2, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert not any('data-code="busy"' in f for f in mine)
    assert turn_texts(mine, "client")[-1] == CRISIS
    assert "988" in turn_texts(mine, "counselor")[0]
    theirs = await frames_until(tab1, DONE, wait=10)  # the first tab sees it too
    assert "988" in turn_texts(theirs, "counselor")[0]

    alert = await watch.receive_from(timeout=5)
    assert 'data-kind="safety_flag"' in alert and 'data-level="crisis"' in alert
    flag = await sync_to_async(SafetyFlag.objects.get)(session=session)
    assert flag.level == "crisis" and await sync_to_async(flag.outbox.exists)()

    # The reply that was being written is superseded: the model may finish, its words
    # never reach either tab and are never stored after the safe reply.
    held_model.release.set()
    later = await frames_for(tab1, 1.5) + await frames_for(tab2, 0.2)
    assert not any("turn-counselor" in f or 'id="pending-text" hx-swap-oob="beforeend"' in f
                   for f in later)  # fmt: skip
    assert await transcript(session) == [
        (0, "client", None, "none"),
        (1, "client", None, "crisis"),
        (2, "counselor", 1, "crisis"),
    ]
    assert await _superseded(session) == [0]  # recorded, for the clinician's review
    for comm in (tab1, tab2, watch):
        await comm.disconnect()


async def test_a_message_from_a_second_tab_mid_reply_is_shown_at_once_and_answered_next(
    held_model,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    tab1, tab2 = await _tabs(profile, session)
    await send(tab1, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(tab1, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)

    await send(tab2, type="message", text="and my sister is visiting", client_msg_id="b1")
    told = await frames_until(tab2, r"will answer it after the current reply", wait=10)
    assert not any('data-code="busy"' in f for f in told)
    assert "and my sister is visiting" in turn_texts(told, "client")
    shown = await frames_until(tab1, r"turn-client[\s\S]*and my sister", wait=10)
    assert turn_texts(shown, "counselor") == []  # shown before the first reply is done
    assert [r[1] for r in await transcript(session)] == ["client", "client"]

    held_model.release.set()
    first = await frames_until(tab1, DONE, wait=60)
    second = await frames_until(tab1, DONE, wait=60)
    assert len(turn_texts(first, "counselor")) == len(turn_texts(second, "counselor")) == 1
    assert [(seq, role, asked) for seq, role, asked, _ in await transcript(session)] == [
        (0, "client", None),
        (1, "client", None),
        (2, "counselor", 0),
        (3, "counselor", 1),
    ]
    for comm in (tab1, tab2):
        await comm.disconnect()


async def test_a_message_sent_while_another_server_writes_is_stored_and_answered_after(
    tiny_engine,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    key = turns.reply_key(session.pk)
    await turns.redis_client().set(key, "other-server", ex=30)
    try:
        await send(comm, type="message", text="me again", client_msg_id="b1")
        frames = await frames_until(comm, r"will answer it after the current reply")
        assert turn_texts(frames, "client") == ["me again"]
        assert [r[1] for r in await transcript(session)] == ["client"]
    finally:
        await turns.redis_client().delete(key)  # the other server's reply is done
    await frames_until(comm, DONE, wait=60)
    assert [r[1] for r in await transcript(session)] == ["client", "counselor"]
    await comm.disconnect()


async def test_a_resent_old_crisis_does_not_stop_the_reply_to_a_later_message(held_model):  # type: ignore[no-untyped-def]
    """A page that missed the safe reply sends the crisis again (same id): it gets the
    stored safe reply, and the reply being written for a LATER message still arrives."""
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    await frames_until(comm, DONE, wait=10)
    await send(comm, type="message", text="thank you for the numbers", client_msg_id="d1")
    await frames_until(comm, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    again = await frames_until(comm, DONE, wait=10)
    assert "988" in turn_texts(again, "counselor")[0]
    held_model.release.set()
    later = await frames_until(comm, DONE, wait=60)
    assert turn_texts(later, "counselor") and "988" not in turn_texts(later, "counselor")[0]
    assert [(r[1], r[2]) for r in await transcript(session)] == [
        ("client", None),
        ("counselor", 0),
        ("client", None),
        ("counselor", 2),
    ]
    await comm.disconnect()


async def test_a_crisis_on_another_server_stops_the_reply_written_here(held_model):  # type: ignore[no-untyped-def]
    """The crisis' server announces it on the session's group: this server's writer stops
    streaming the superseded reply and clears its bubble."""
    from channels.layers import get_channel_layer

    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(comm, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)
    await get_channel_layer().group_send(
        session_group(session.pk), {"type": "chat.supersede", "before_seq": 1}
    )
    cleared = await frames_until(comm, r'<div id="pending" hx-swap-oob="innerHTML"></div>')
    assert not any("turn-counselor" in f for f in cleared)
    held_model.release.set()
    assert not any("turn-counselor" in f for f in await frames_for(comm, 1.5))
    assert [r[1] for r in await transcript(session)] == ["client"]
    await comm.disconnect()


async def test_a_concern_is_flagged_with_its_message_and_still_answered_by_the_model(
    tiny_engine,
):  # type: ignore[no-untyped-def]
    """A concern is assessed once, flagged in the transaction that stores the message (no
    e-mail: that is for a crisis), and then answered by the model as usual."""
    text = "my friend said she wants to kill herself"
    assert safety.assess(text).level == "concern"
    profile, session = await sync_to_async(_client)()
    watch, _, _, _ = await connect("/ws/notifications/", profile.clinician)
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text=text, client_msg_id="k1")
    frames = await frames_until(comm, DONE, wait=60)
    assert "988" not in turn_texts(frames, "counselor")[0]  # the model's reply
    flags = await sync_to_async(
        lambda: [(f.level, f.turn.seq, f.outbox.count()) for f in SafetyFlag.objects.all()]
    )()
    assert flags == [("concern", 0, 0)]
    alert = await watch.receive_from(timeout=5)
    assert 'data-level="concern"' in alert
    assert await transcript(session) == [
        (0, "client", None, "concern"),
        (1, "counselor", 0, "concern"),
    ]
    for sock in (comm, watch):
        await sock.disconnect()


# -- the flag is durable ---------------------------------------------------------------------


def _answered_without_flag():  # type: ignore[no-untyped-def]
    """A safe reply stored with no flag beside it (the state a crash between the two
    writes used to leave)."""
    profile, session = _client()
    services.append_turn(
        session.pk, "client", CRISIS, author=profile.user, client_msg_id="c1",
        safety_level="crisis",
    )  # fmt: skip
    Turn.objects.create(
        session=session, seq=1, role="counselor", text=safety.safe_response(),
        safety_level="crisis", in_reply_to=0,
    )  # fmt: skip
    return profile, session


async def test_a_resent_crisis_whose_safe_reply_has_no_flag_raises_it_once(tiny_engine):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_answered_without_flag)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert "988" in turn_texts(frames, "counselor")[0]
    await send(comm, type="retry", client_msg_id="c1")  # and again: still one of each
    await frames_until(comm, DONE, wait=10)
    flags = await sync_to_async(
        lambda: [
            (f.level, f.turn.seq, f.outbox.count())
            for f in SafetyFlag.objects.filter(session=session)
        ]
    )()
    assert flags == [("crisis", 0, 1)]
    assert [r[1] for r in await transcript(session)] == ["client", "counselor"]
    await comm.disconnect()


async def test_a_safe_reply_is_never_stored_without_its_flag(tiny_engine, monkeypatch):  # type: ignore[no-untyped-def]
    """The flag and the safe reply commit together: when the flag cannot be written,
    neither is stored, and the person still gets the safe reply."""
    from django.db import DatabaseError

    from webapp.oversight import alerts

    store_flag = alerts.store_flag
    disk = {"full": True}

    def full_until_freed(*args, **kwargs):  # type: ignore[no-untyped-def]
        if disk["full"]:
            raise DatabaseError("could not extend file: No space left on device")
        return store_flag(*args, **kwargs)

    monkeypatch.setattr(alerts, "store_flag", full_until_freed)
    monkeypatch.setattr(turns, "HOLD_RETRY_SECONDS", (0.1, 0.3))
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    started = time.monotonic()
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert "988" in turn_texts(frames, "counselor")[0]
    await asyncio.sleep(0.5)
    assert await transcript(session) == []
    assert not await sync_to_async(SafetyFlag.objects.exists)()
    disk["full"] = False  # then all of it is written, together
    assert (await _wait_for_flag(session)).level == "crisis"
    assert [r[1] for r in await transcript(session)] == ["client", "counselor"]
    await comm.disconnect()


# -- ending a session, and duplicate writers ----------------------------------------------------


async def test_ending_the_session_mid_reply_stores_no_reply_and_no_evidence(held_model):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(comm, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)
    await turns.end_session(session.pk, None)  # what the end view runs
    held_model.release.set()
    later = await frames_for(comm, 1.5)
    assert not any("turn-counselor" in f for f in later)
    await sync_to_async(session.refresh_from_db)()
    assert session.status == Session.Status.ENDED
    assert [r[1] for r in await transcript(session)] == ["client"]
    assert not await sync_to_async(CandidateGroup.objects.filter(session=session).exists)()
    await comm.disconnect()


async def test_a_crisis_typed_into_a_page_left_open_after_the_end_is_flagged(tiny_engine):  # type: ignore[no-untyped-def]
    """The session ended in another tab; this one is still open (or reconnected): the
    crisis is answered, kept and flagged all the same. A plain message is refused."""
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await turns.end_session(session.pk, None)
    await send(comm, type="message", text="one more thing", client_msg_id="p1")
    assert 'data-code="session_closed"' in (await frames_until(comm, r"data-code=", wait=10))[-1]
    started = time.monotonic()
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert "988" in turn_texts(frames, "counselor")[0]
    assert (await _wait_for_flag(session)).level == "crisis"
    assert await transcript(session) == [
        (0, "client", None, "crisis"),
        (1, "counselor", 0, "crisis"),
    ]
    await comm.disconnect()


def _orphan():  # type: ignore[no-untyped-def]
    profile, session = _client()
    services.append_turn(session.pk, "client", "I feel anxious", client_msg_id="r1")
    return profile, session


async def test_two_tabs_retrying_one_message_with_redis_down_get_one_reply(
    tiny_engine, on_private_redis
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_orphan)()
    tab1, tab2 = await _tabs(profile, session)
    on_private_redis.kill()
    await asyncio.to_thread(on_private_redis.wait, 10)
    await asyncio.gather(
        send(tab1, type="retry", client_msg_id="r1"), send(tab2, type="retry", client_msg_id="r1")
    )
    await asyncio.wait(
        [asyncio.ensure_future(frames_until(t, DONE, wait=60)) for t in (tab1, tab2)],
        return_when=asyncio.FIRST_COMPLETED,
    )
    await asyncio.sleep(1.0)  # the other tab's writer, had it run, would commit by now
    assert [(r[1], r[2]) for r in await transcript(session)] == [("client", None), ("counselor", 0)]
    for comm in (tab1, tab2):
        await comm.disconnect()


# -- the commit's guards, without a socket ------------------------------------------------------


def _reply(session_id: int, asked: int) -> Turn:
    return services.record_counselor_turn(
        session_id, "a reply", decision=None, group=None, safety_level="none", in_reply_to=asked
    )


def test_a_reply_to_a_message_a_crisis_covered_is_refused_at_commit() -> None:
    """A writer in another process that never heard of the crisis still cannot store it."""
    profile, session = _client()
    services.append_turn(session.pk, "client", "I feel anxious", client_msg_id="a1")
    services.record_safe_reply(
        session.pk, CRISIS, author=profile.user, client_msg_id="c1",
        assessment=safety.assess(CRISIS), reply=safety.safe_response(),
    )  # fmt: skip
    with pytest.raises(services.Superseded):
        _reply(session.pk, 0)
    assert services.open_client_turns(session.pk) == []


def test_a_reply_to_an_ended_session_is_refused_at_commit() -> None:
    _, session = _client()
    services.append_turn(session.pk, "client", "I feel anxious", client_msg_id="a1")
    Session.objects.filter(pk=session.pk).update(status="ended", ended_at="2026-01-01T00:00Z")
    with pytest.raises(services.SessionError) as err:
        _reply(session.pk, 0)
    assert err.value.code == "session_closed"
    assert Turn.objects.filter(session=session).count() == 1


def test_the_engine_pairs_each_reply_with_the_message_it_answers() -> None:
    """Messages sent while a reply was written sit between that reply and its message."""
    _, session = _client()
    for i, text in enumerate(["first", "second"]):
        services.append_turn(session.pk, "client", text, client_msg_id=f"m{i}")
    _reply(session.pk, 0)
    assert [t.seq for t in services.open_client_turns(session.pk)] == [1]
    records = services.stored_turns(session).records
    assert [(r.client_text, r.reply) for r in records] == [("first", "a reply")]
    _reply(session.pk, 1)
    records = services.stored_turns(session).records
    assert [r.client_text for r in records] == ["first", "second"]


# -- the safe reply survives every dependency failure -------------------------------------------


async def _wait_for_flag(session, seconds: float = 15):  # type: ignore[no-untyped-def]
    for _ in range(int(seconds / 0.05)):
        flag = await sync_to_async(SafetyFlag.objects.filter(session=session).first)()
        if flag is not None and await sync_to_async(flag.outbox.exists)():
            return flag
        await asyncio.sleep(0.05)
    raise AssertionError("no crisis flag with its outbox row")


async def test_a_crisis_with_postgres_down_is_answered_and_written_when_it_returns(
    tiny_engine, monkeypatch
):  # type: ignore[no-untyped-def]
    from django.db import OperationalError

    write = services.record_safe_reply
    storage = {"up": False}

    def unreachable_until_up(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not storage["up"]:
            raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")
        return write(*args, **kwargs)

    monkeypatch.setattr(services, "record_safe_reply", unreachable_until_up)
    monkeypatch.setattr(turns, "HOLD_RETRY_SECONDS", (0.1, 0.3))
    profile, session = await sync_to_async(_client)()
    watch, _, _, _ = await connect("/ws/notifications/", profile.clinician)
    (comm,) = await _tabs(profile, session, 1)
    started = time.monotonic()
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert "988" in turn_texts(frames, "counselor")[0]
    await asyncio.sleep(0.5)
    assert await transcript(session) == []  # held, not lost: storage is still down

    storage["up"] = True
    flag = await _wait_for_flag(session)
    assert flag.level == "crisis"
    assert await transcript(session) == [
        (0, "client", None, "crisis"),
        (1, "counselor", 0, "crisis"),
    ]
    alert = await watch.receive_from(timeout=5)
    assert 'data-kind="safety_flag"' in alert and 'data-level="crisis"' in alert
    for sock in (comm, watch):
        await sock.disconnect()


async def test_a_message_sent_with_postgres_down_is_held_then_stored_and_answered(
    tiny_engine, monkeypatch
):  # type: ignore[no-untyped-def]
    from django.db import OperationalError

    store = services.store_client_message
    storage = {"up": False}

    def unreachable_until_up(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not storage["up"]:
            raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")
        return store(*args, **kwargs)

    monkeypatch.setattr(services, "store_client_message", unreachable_until_up)
    monkeypatch.setattr(turns, "HOLD_RETRY_SECONDS", (0.1, 0.3))
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text="work has been hard", client_msg_id="h1")
    held = await frames_until(comm, r'data-code="held"', wait=10)
    # Kept by the server, and offered back with its id in case this server goes first.
    assert 'name="client_msg_id" value="h1"' in held[-1]
    assert 'name="text" value="work has been hard"' in held[-1]
    assert await transcript(session) == []

    storage["up"] = True
    frames = await frames_until(comm, DONE, wait=60)
    assert turn_texts(frames, "client") == ["work has been hard"]
    assert [r[1] for r in await transcript(session)] == ["client", "counselor"]
    await comm.disconnect()


async def test_postgres_lost_between_two_queued_replies_offers_try_again(held_model, monkeypatch):  # type: ignore[no-untyped-def]
    """The first reply is stored; storage then goes before the writer looks for the next
    message: that message is offered "Try again" (kept), never "Something went wrong"."""
    from django.db import OperationalError

    profile, session = await sync_to_async(_client)()
    tab1, tab2 = await _tabs(profile, session)
    await send(tab1, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(tab1, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)
    await send(tab2, type="message", text="and my sister is visiting", client_msg_id="b1")
    await frames_until(tab2, r"will answer it after the current reply", wait=10)

    def unreachable(session_id):  # type: ignore[no-untyped-def]
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(services, "open_client_turns", unreachable)
    held_model.release.set()
    first = await frames_until(tab1, DONE, wait=60)
    assert len(turn_texts(first, "counselor")) == 1
    offered = await frames_until(tab2, r'data-code="storage_unavailable"', wait=30)
    assert 'name="client_msg_id" value="b1"' in offered[-1]
    everything = first + offered + await frames_for(tab1, 0.5)
    assert not any('data-code="internal_error"' in f for f in everything)
    assert [r[1] for r in await transcript(session)] == ["client", "client", "counselor"]
    for comm in (tab1, tab2):
        await comm.disconnect()


async def test_a_socket_opened_while_redis_is_down_still_gets_the_safe_reply(
    tiny_engine, on_private_redis
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    on_private_redis.kill()
    await asyncio.to_thread(on_private_redis.wait, 10)
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    started = time.monotonic()
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert "988" in turn_texts(frames, "counselor")[0]
    assert (await _wait_for_flag(session)).level == "crisis"
    await comm.disconnect()


async def test_an_engine_that_cannot_be_rebuilt_still_gives_the_safe_reply(
    tiny_engine, monkeypatch
):  # type: ignore[no-untyped-def]
    def cannot_rebuild(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("memory item 7 could not be decrypted")

    monkeypatch.setattr(turns, "counselor_for", cannot_rebuild)
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text="I feel anxious about work", client_msg_id="a1")
    failed = await frames_until(comm, r'data-code="internal_error"', wait=10)
    assert 'name="client_msg_id" value="a1"' in failed[-1]  # "Try again", message kept
    started = time.monotonic()
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < BOUND_S
    assert "988" in turn_texts(frames, "counselor")[0]
    assert (await _wait_for_flag(session)).level == "crisis"
    assert [r[1] for r in await transcript(session)] == ["client", "client", "counselor"]
    await comm.disconnect()


async def test_a_tab_opened_or_reloaded_mid_reply_shows_the_reply_being_written(held_model):  # type: ignore[no-untyped-def]
    """Seen in a browser: a page reloaded while a judged reply was written showed nothing
    until the reply landed (minutes on a CPU). Its resync now gets what the other tabs
    show: the writing bubble and the latest status, never "Try again" for a live reply."""
    profile, session = await sync_to_async(_client)()
    [tab1] = await _tabs(profile, session, 1)
    await send(tab1, type="message", text="I feel anxious about work", client_msg_id="a1")
    await frames_until(tab1, WRITING)
    await asyncio.wait_for(held_model.started.wait(), 10)

    [reloaded] = await _tabs(profile, session, 1)
    await send(reloaded, type="resync", after_seq=0)  # its page was rendered with the message
    seen = await frames_for(reloaded, 1.0)
    assert any(WRITING in f for f in seen), seen
    assert any(re.search(r'class="status busy"[^>]*>\S', f) for f in seen), seen
    assert not any("reply_interrupted" in f for f in seen)

    held_model.release.set()
    landed = await frames_until(reloaded, DONE, wait=60)
    assert len(turn_texts(landed, "counselor")) == 1
    for comm in (tab1, reloaded):
        await comm.disconnect()
    # Once the reply is stored, a new tab is shown no bubble.
    [later] = await _tabs(profile, session, 1)
    await send(later, type="resync", after_seq=-1)
    after = await frames_for(later, 1.0)
    assert len(turn_texts(after, "counselor")) == 1
    assert not any(WRITING in f for f in after)
    await later.disconnect()


async def test_the_safe_reply_never_waits_on_the_kept_writing_view(tiny_engine, monkeypatch):  # type: ignore[no-untyped-def]
    """Clearing the Redis-kept "writing" view (a Redis call that can take seconds when
    Redis hangs) comes after the reply's frames: here it never returns, and the crisis
    reply still reaches the tab."""
    from webapp.counseling.consumers import SessionConsumer

    never = asyncio.Event()
    cleared: list[int] = []

    async def hanging(self):  # type: ignore[no-untyped-def]
        cleared.append(self.session_id)
        await never.wait()

    monkeypatch.setattr(SessionConsumer, "_forget_writing", hanging)
    profile, session = await sync_to_async(_client)()
    (comm,) = await _tabs(profile, session, 1)
    await send(comm, type="message", text=CRISIS, client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert "988" in turn_texts(frames, "counselor")[0]
    for _ in range(200):  # the clearing follows the frames (to the group too)
        if cleared:
            break
        await asyncio.sleep(0.05)
    assert cleared == [session.pk]
    never.set()
    await comm.disconnect()
