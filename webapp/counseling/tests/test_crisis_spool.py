"""A crisis held while PostgreSQL is down survives the process dying (issue 17, item 3).

The crisis is answered from memory and spooled to disk; the process then "dies" (its
holding task is cancelled and its memory of the spool is gone). When storage is back, the
record is written, flagged and removed: at the next successful write in a process sharing
the spool, or at process start.
"""

from __future__ import annotations

import asyncio
import stat
import sys
import threading
import traceback

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import services, spool, turns
from webapp.counseling.models import Turn
from webapp.oversight.models import AlertOutbox, SafetyFlag

CRISIS = "honestly I am done, I have the pills counted out and I am taking them tonight"


def _spool_state() -> str:
    """What a timed-out replay test needs to be diagnosed: the folder, the lock, and the
    stacks of the spool's threads."""
    frames = sys._current_frames()
    stacks = [
        f"{t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
        for t in threading.enumerate()
        if t.ident in frames and ("spool" in t.name or "notify" in t.name)
    ]
    return (
        f"timed out: pending={spool.pending()} locked={spool._replaying.locked()} "
        f"requested={spool._requested.is_set()} threads={[t.name for t in threading.enumerate()]}\n"
        + "\n".join(stacks)
    )


def _client():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


async def _eventually(check, seconds: float = 60.0):  # type: ignore[no-untyped-def]
    """Polls until ``check`` holds: a bound for a loaded 2-core machine, not a timing."""
    for _ in range(int(seconds / 0.05)):
        if value := await sync_to_async(check)():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
@pytest.mark.parametrize("replayed_by", ["the next write", "process start"])
async def test_a_crisis_held_when_the_process_dies_is_written_later(  # type: ignore[no-untyped-def]
    tiny_engine, settings, tmp_path, monkeypatch, replayed_by
):
    settings.CRISIS_SPOOL_DIR = tmp_path / "spool"
    monkeypatch.setattr(spool, "_holding", set())
    write = services.record_safe_reply
    storage = {"up": False}

    def unreachable_until_up(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not storage["up"]:
            raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")
        return write(*args, **kwargs)

    monkeypatch.setattr(services, "record_safe_reply", unreachable_until_up)
    monkeypatch.setattr(turns, "HOLD_RETRY_SECONDS", (3600.0, 3600.0))  # it never retries
    profile, session = await sync_to_async(_client)()

    message = turns.ClientMessage(session.pk, profile.user, CRISIS)  # no message id
    events = [e async for e in turns.client_message(message)]
    assert [type(e) for e in events] == [turns.Replied]
    assert "988" in events[0].turn.text and events[0].turn.pk is None  # from memory
    names = await _eventually(spool.pending)
    assert len(names) == 1
    base = settings.CRISIS_SPOOL_DIR
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert stat.S_IMODE((base / names[0]).stat().st_mode) == 0o600

    # The process dies: its holding task and its memory go; the file stays.
    holders = [t for t in turns.background if "_write_when_storage_returns" in repr(t)]
    assert len(holders) == 1
    holders[0].cancel()
    spool._holding.clear()
    assert await sync_to_async(Turn.objects.filter(session=session).count)() == 0

    storage["up"] = True
    if replayed_by == "the next write":
        _, other = await sync_to_async(_client)()
        plain = turns.ClientMessage(other.pk, other.client, "work has been hard", msg_id="p1")
        async for event in turns.client_message(plain):
            if isinstance(event, turns.Stored):
                break
    else:
        spool.replay_soon()

    try:
        flag = await _eventually(SafetyFlag.objects.filter(session=session).first)
    except AssertionError:
        raise AssertionError(_spool_state()) from None
    assert flag.level == "crisis"
    assert await sync_to_async(AlertOutbox.objects.filter(flag=flag).exists)()
    rows = await sync_to_async(list)(
        Turn.objects.filter(session=session)
        .order_by("seq")
        .values_list("role", "safety_level", "text")
    )
    assert [r[:2] for r in rows] == [("client", "crisis"), ("counselor", "crisis")]
    assert rows[0][2] == CRISIS
    await _eventually(lambda: not spool.pending())
    assert not list(base.iterdir())  # nothing left, nothing quarantined


@pytest.mark.django_db
def test_a_record_is_stored_once_however_often_it_is_replayed(settings, tmp_path):  # type: ignore[no-untyped-def]
    """Two processes replaying the same file (or a replay racing the holding task) store
    the crisis once: the record carries a message id, and the crisis transaction is
    idempotent per id."""
    from counselor_engine import safety

    settings.CRISIS_SPOOL_DIR = tmp_path / "spool"
    profile, session = _client()
    record = spool.as_record(
        session.pk, profile.user, "held-1", CRISIS, safety.assess(CRISIS), "safe reply"
    )
    first, second = spool.hold(record), spool.hold(record)
    spool._holding.difference_update({first, second})
    assert spool.replay() == 2
    assert Turn.objects.filter(session=session).count() == 2
    assert SafetyFlag.objects.filter(session=session).count() == 1
    assert spool.pending() == []


@pytest.mark.django_db
def test_a_replay_asked_for_while_one_runs_is_not_lost(settings, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A record spooled after a running replay listed the folder, whose own replay finds
    that one busy, is written by the running replay before it stops (not at some later
    write): the request is remembered, not dropped."""
    from counselor_engine import safety

    settings.CRISIS_SPOOL_DIR = tmp_path / "spool"
    profile, session = _client()
    _, other = _client()
    assessment = safety.assess(CRISIS)
    first = spool.hold(spool.as_record(session.pk, profile.user, "a", CRISIS, assessment, "r"))
    spool._holding.discard(first)
    write = services.record_safe_reply
    nested: list[int] = []

    def write_then_spool_another(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not nested:  # while the first record is being written, a second one arrives
            late = spool.as_record(other.pk, other.client, "b", CRISIS, assessment, "r")
            spool._holding.discard(spool.hold(late))
            nested.append(spool.replay())  # its own replay: the running one is busy
        return write(*args, **kwargs)

    monkeypatch.setattr(services, "record_safe_reply", write_then_spool_another)
    assert spool.replay() == 2
    assert nested == [0]
    assert spool.pending() == []
    assert SafetyFlag.objects.filter(session__in=[session, other]).count() == 2


@pytest.mark.django_db
def test_a_replays_notifications_run_after_it_lets_go(settings, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The written flag's pushes and e-mail task run after the replay released its lock:
    a slow channel layer or broker must not hold up the next crisis replay."""
    from counselor_engine import safety

    settings.CRISIS_SPOOL_DIR = tmp_path / "spool"
    profile, session = _client()
    record = spool.as_record(session.pk, profile.user, "n", CRISIS, safety.assess(CRISIS), "r")
    spool._holding.discard(spool.hold(record))
    write = services.record_safe_reply
    locked_during_step: list[bool] = []

    def with_a_watching_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        safe = write(*args, **kwargs)
        safe.dispatch.append(lambda: locked_during_step.append(spool._replaying.locked()))
        return safe

    monkeypatch.setattr(services, "record_safe_reply", with_a_watching_step)
    assert spool.replay() == 1
    assert locked_during_step == [False]
    assert SafetyFlag.objects.filter(session=session).count() == 1


@pytest.mark.django_db
def test_the_spool_keeps_no_client_words_readable_on_disk(settings, tmp_path):  # type: ignore[no-untyped-def]
    """The record is encrypted like turn text in PostgreSQL; a record no key opens (the key
    was removed) is set aside as .bad, never half-written."""
    from counselor_engine import safety

    settings.CRISIS_SPOOL_DIR = tmp_path / "spool"
    profile, session = _client()
    record = spool.as_record(
        session.pk, profile.user, "held-2", CRISIS, safety.assess(CRISIS), "safe reply"
    )
    name = spool.hold(record)
    data = (tmp_path / "spool" / name).read_bytes()
    assert b"pills" not in data and b"safe reply" not in data
    assert spool.HeldCrisis.from_json(data) == record
    spool._holding.discard(name)
    settings.PSYEVO_ENCRYPTION_KEYS = [crypto_key()]
    assert spool.replay() == 0
    assert [p.suffix for p in (tmp_path / "spool").iterdir()] == [".bad"]
    assert not SafetyFlag.objects.filter(session=session).exists()


def crypto_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()
