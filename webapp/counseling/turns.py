"""The client turn's one home: every client message goes through :func:`client_message`.

The chat socket, the simulation lab and the session end all come here; none of them
stores a message, assesses it or calls the engine by itself. One message, in order:

1. Validate it (text, size, message id), once.
2. ``safety.assess`` it, once, before any busy, lock, pause or model decision.
3. A crisis: the message, the fixed safe reply, the crisis flag and its email outbox row
   are written in ONE transaction; a reply being written for an earlier message is
   superseded (it stops streaming and is never stored or shown); the flag's live push,
   delivery task and escalation check run after the safe reply has gone out. None of
   this needs the model, the engine or the session's writer.
4. Otherwise the message is stored at once (a concern raises its flag in the same
   transaction), then answered in order: one writer per session (:class:`SessionWriter`,
   across tabs and server processes) answers every open client turn oldest first, so a
   message sent while a reply is being written waits for it and is never refused.
5. Per answered turn: the AI pause, the pinned adapter's verification and loading, the
   engine (rebuilt from PostgreSQL) and the reply with its evidence, stored under the
   session's row lock (an ended session or an already answered message takes nothing).

It yields events (:data:`TurnEvent`) and never touches a socket: the consumer turns them
into frames and decides who sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError
from django.db import connection as db_connection

from counselor_engine import safety
from counselor_engine.backends import BackendError
from counselor_engine.backends.adapter_files import AdapterRefused
from counselor_engine.counselor import (
    Counselor,
    DoneEvent,
    ErrorEvent,
    Event,
    ProgressEvent,
    TokenEvent,
)
from counselor_engine.counselor import SessionRating as Rating
from counselor_engine.text import strip_control
from webapp.counseling import services, spool
from webapp.counseling.models import Session, Turn
from webapp.counseling.runtime import counselor_for, get_backend
from webapp.learning.models import AdapterVersion
from webapp.learning.services import NotServable, servable_path
from webapp.lib import audit
from webapp.lib.groups import session_group
from webapp.memory import services as memory_services
from webapp.oversight.models import ClientControl

log = logging.getLogger(__name__)

MAX_MSG_ID = 64
# How often a message waiting behind another reply looks again (it is stored already).
POLL_SECONDS = 0.2
# Seconds between tries to write a message held while PostgreSQL is down: doubling from
# the first, up to the second. A plain message is held at most HOLD_LIMIT_SECONDS (then
# offered back to send again); a crisis is held until it is written.
HOLD_RETRY_SECONDS = (0.5, 30.0)
HOLD_LIMIT_SECONDS = 600.0

# Work that outlives its socket (a reply whose page went away is still stored; a flag's
# notifications): the loop keeps only weak references to tasks, so we keep strong ones.
background: set[asyncio.Task[Any]] = set()


def keep(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    background.add(task)
    task.add_done_callback(background.discard)
    return task


# -- events ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rejected:
    """Nothing was stored (bad input, session ended, storage down): for the sender only.
    ``resend_text`` with ``retry_msg_id``: offer the message back to send again."""

    code: str
    message: str
    retry_msg_id: str = ""
    resend_text: str = ""


@dataclass(frozen=True)
class Held:
    """Storage is down: the message is kept in this process and written (then answered)
    as soon as PostgreSQL is back; for the sender, with the text to send again in case
    this process does not live that long (the same id is stored once)."""

    msg_id: str
    text: str


@dataclass(frozen=True)
class Stored:
    """The message is stored and assessed; ``new`` is False for a resend of a stored one."""

    turn: Turn
    new: bool


@dataclass(frozen=True)
class Queued:
    """Stored while another reply is being written: it is answered after that one."""

    seq: int


@dataclass(frozen=True)
class Paused:
    """The AI is paused for this client: the clinician answers."""

    seq: int


@dataclass(frozen=True)
class Writing:
    """A reply is being written for client turn ``seq - 1`` (``seq`` is where it is
    expected; a message sent meanwhile moves it later)."""

    seq: int


@dataclass(frozen=True)
class Token:
    seq: int
    index: int
    text: str


@dataclass(frozen=True)
class Progress:
    """The engine's own progress on a judged reply (``ProgressEvent``): replies drafted,
    comparisons done out of total."""

    seq: int
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Replied:
    """The reply, stored (``turn.pk`` is None for a safe reply sent from memory while
    storage is down)."""

    turn: Turn


@dataclass(frozen=True)
class Failed:
    """The message is stored but got no reply; ``retry_msg_id`` offers "Try again"."""

    seq: int
    code: str
    message: str
    retry_msg_id: str = ""


@dataclass(frozen=True)
class Withdrawn:
    """A reply that was being written will not be delivered (a crisis or another tab's
    reply covered its message first): clear its pending bubble."""

    seq: int


TurnEvent = (
    Rejected
    | Held
    | Stored
    | Queued
    | Paused
    | Writing
    | Progress
    | Token
    | Replied
    | Failed
    | Withdrawn
)


@dataclass(frozen=True)
class ClientMessage:
    session_id: int
    author: Any  # the client's User (None for none)
    text: object
    msg_id: str = ""
    retry: bool = False  # "Try again": answer the stored message with this id


# seq of the client turn -> CounselorConfig overrides (the simulation lab's seeds).
Overrides = Callable[[int], dict[str, Any]]


# -- validation (once per message) ------------------------------------------------------------
def is_unicode_text(text: str) -> bool:
    """False for text holding lone surrogates (a JSON escape like ``\\ud800`` makes one):
    it can be neither stored as UTF-8 nor shown."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_msg_id(msg_id: Any) -> bool:
    """A client message id is short printable text (no NUL, controls or lone surrogates:
    it is stored beside the turn and echoed in "Try again" buttons)."""
    return isinstance(msg_id, str) and len(msg_id) <= MAX_MSG_ID and msg_id.isprintable()


def check_text(text: Any) -> tuple[str, str] | None:
    if not isinstance(text, str):
        return ("not_text", "Messages must be text.")
    if not is_unicode_text(text):
        return ("bad_text", "That message contains characters that cannot be read.")
    if not text.strip():
        return ("empty_message", "Write something before sending.")
    if len(text) > settings.PSYEVO_MAX_MESSAGE_CHARS:
        return (
            "too_long",
            f"Messages are limited to {settings.PSYEVO_MAX_MESSAGE_CHARS} characters.",
        )
    return None


# -- the session's writer -----------------------------------------------------------------------
_redis_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)


def redis_client() -> aioredis.Redis:
    """One asyncio Redis client per event loop (its connections belong to that loop)."""
    loop = asyncio.get_running_loop()
    client = _redis_by_loop.get(loop)
    if client is None:
        client = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5
        )
        _redis_by_loop[loop] = client
    return client


def reply_key(session_id: int) -> str:
    return f"psyevo:reply:{session_id}"


def reply_view_key(session_id: int) -> str:
    """What the session's tabs last showed of the reply being written (the writing bubble
    and the latest status or progress line), for a tab that opens or reloads meanwhile."""
    return f"psyevo:reply-view:{session_id}"


class ReplyLock:
    """Marks "a reply is being written" for a session, across processes.

    The mark is a short lease renewed while the reply is written: a server process that
    dies mid-reply leaves it for at most ``LEASE_SECONDS``, after which a message waiting
    behind it (through any server) is answered."""

    LEASE_SECONDS = 15
    _RENEW = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then "
        "return redis.call('expire', KEYS[1], ARGV[2]) end return 0"
    )
    _RELEASE = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
        "return 0"
    )
    GRACE_SECONDS = 1.0

    def __init__(self, session_id: int) -> None:
        self.key = reply_key(session_id)
        self.token = secrets.token_hex(8)
        self._renewer: asyncio.Task[None] | None = None

    async def acquire(self, *, grace: float | None = None) -> bool:
        """Take the mark, waiting up to ``grace`` seconds for a holder to let go."""
        wait = self.GRACE_SECONDS if grace is None else grace
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            got = await redis_client().set(self.key, self.token, nx=True, ex=self.LEASE_SECONDS)
            if got:
                self._renewer = asyncio.create_task(self._renew())
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.LEASE_SECONDS / 3)
            try:
                await redis_client().eval(self._RENEW, 1, self.key, self.token, self.LEASE_SECONDS)
            except Exception as exc:  # Redis restarting: try again at the next beat
                log.warning("could not renew reply lock %s: %s", self.key, exc)

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        # Delete only our own mark: after a lease expiry another writer may own the key.
        await redis_client().eval(self._RELEASE, 1, self.key, self.token)


_local_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class SessionWriter:
    """The one writer of a session's replies: a lock in this process, plus the Redis
    lease for other server processes. With Redis down the process lock alone holds (two
    tabs on one server still get one reply); across processes the reply's commit refuses
    a message another reply already answered (``services.Superseded``)."""

    def __init__(self, session_id: int) -> None:
        loop = asyncio.get_running_loop()
        self.local = _local_writers.setdefault(loop, {}).setdefault(session_id, asyncio.Lock())
        self.remote: ReplyLock | None = ReplyLock(session_id)

    async def try_acquire(self) -> bool:
        if self.local.locked():
            return False
        await self.local.acquire()
        assert self.remote is not None
        try:
            if await self.remote.acquire(grace=0):
                return True
        except Exception as exc:  # Redis down must not stop a reply
            log.warning("reply lock unavailable (Redis): %s", exc)
            self.remote = None
            return True
        self.local.release()
        return False

    async def release(self) -> None:
        if self.remote is not None:
            try:
                await self.remote.release()
            except Exception as exc:
                log.warning("could not release reply lock: %s", exc)
        self.local.release()


# -- replies in flight (this process) -----------------------------------------------------------
@dataclass(eq=False)
class _Flight:
    session_id: int
    seq: int  # the client turn being answered
    stop: asyncio.Event = field(default_factory=asyncio.Event)


_flights: dict[int, set[_Flight]] = {}


def supersede(session_id: int, before_seq: int | None = None) -> int:
    """Stop the replies this process is writing for the session's messages before
    ``before_seq`` (all of them when None: the session ended, or a crisis not yet given
    its seq); returns how many. Their messages stay stored. Other server processes hear
    of it through the session's group (:func:`announce_supersede`); the commit's check is
    the backstop for one that does not."""
    flights = [f for f in _flights.get(session_id, ()) if before_seq is None or f.seq < before_seq]
    for flight in flights:
        flight.stop.set()
    return len(flights)


async def announce_supersede(session_id: int, before_seq: int) -> None:
    """Tell every server process with a socket on the session (its consumers call
    :func:`supersede`). In the background: with Redis down this takes seconds to fail,
    and the commit's check still holds."""
    from channels.layers import get_channel_layer

    try:
        await get_channel_layer().group_send(
            session_group(session_id), {"type": "chat.supersede", "before_seq": before_seq}
        )
    except Exception as exc:
        log.warning("session %s: could not announce the crisis to other servers: %s",
                    session_id, exc)  # fmt: skip


_SUPERSEDED = object()


async def _next_unless_stopped(events: AsyncIterator[Event], flight: _Flight) -> object:
    """The engine's next event, or ``_SUPERSEDED`` as soon as the flight is stopped (the
    engine's await is cancelled: a graph-mode reply can take most of a minute)."""
    step = asyncio.ensure_future(anext(events, None))
    stop = asyncio.ensure_future(flight.stop.wait())
    try:
        done, _ = await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if step in done:
        return step.result()
    step.cancel()
    with contextlib.suppress(BaseException):
        await step
    return _SUPERSEDED


# -- helpers on threads -------------------------------------------------------------------------
# Pools of the turn's own, apart from asyncio's default one (which ``to_thread`` and
# ``sync_to_async(thread_sensitive=False)`` share with everything else in the process):
# a crisis, its assessment and its transaction, must never wait for a thread behind work
# that can block for seconds in an outage. In the soak, a flag's notification steps
# retrying a Redis broker that was down held the default pool's threads, and the
# assessment of a crisis sent then waited 2.5 s for one (bench/soak.py, Redis probe).
SAFETY_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="psyevo-safety")
NOTIFY_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="psyevo-notify")


async def _on(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(fn, *args, **kwargs)
    )


def off_shared_thread(
    fn: Callable[..., Any], pool: ThreadPoolExecutor = SAFETY_POOL
) -> Callable[..., Any]:
    """``fn`` on a thread of ``pool``, whose connection is closed after: ORM work on a
    message's path to its safety decision (the socket's authorization, the crisis
    transaction) must not queue behind other sessions' work on the shared ORM thread,
    nor behind anything on the default pool."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            db_connection.close()

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await _on(pool, run, *args, **kwargs)

    return call


def _run_steps(steps: Sequence[Callable[[], None]]) -> None:
    for step in steps:
        try:
            step()
        except Exception:
            log.exception("a flag notification step failed (the flag is stored)")


def _dispatch_later(steps: Sequence[Callable[[], None]]) -> None:
    """A flag's pushes and tasks, after the reply: each can take seconds to give up, so
    they run on their own pool."""
    if steps:
        keep(asyncio.ensure_future(_on(NOTIFY_POOL, _run_steps, list(steps))))


def _stored_text(session_id: int, msg_id: str) -> str | None:
    if not msg_id:
        return None
    turn = Turn.objects.filter(
        session_id=session_id, client_msg_id=msg_id, role=Turn.Role.CLIENT
    ).first()
    return None if turn is None else turn.text


def _assessment_of(turn: Turn) -> safety.SafetyAssessment:
    """The stored verdict of a message answered by another message's writer."""
    level = turn.safety_level if turn.safety_level in ("none", "concern", "crisis") else "none"
    return safety.SafetyAssessment(level=level)  # type: ignore[arg-type]


def _build(
    session_id: int, seq: int, overrides: Overrides | None
) -> tuple[Counselor, bool, AdapterVersion | None] | None:
    """The engine for this session rebuilt from storage, the AI pause, the pinned version;
    None when the message is answered already (a crisis' safe reply covered it)."""
    if all(t.seq != seq for t in services.open_client_turns(session_id)):
        return None
    counselor, session = counselor_for(
        session_id, seq, overrides=overrides(seq) if overrides else None
    )
    control = ClientControl.objects.filter(client_id=session.client_id).first()
    return counselor, bool(control and control.ai_paused), session.adapter_version


# -- the turn -----------------------------------------------------------------------------------
async def client_message(
    msg: ClientMessage, *, overrides: Overrides | None = None
) -> AsyncIterator[TurnEvent]:
    """Take one client message through the steps in the module docstring."""
    if not valid_msg_id(msg.msg_id):
        yield Rejected("bad_message_id", "That message could not be read.")
        return
    text = msg.text
    if msg.retry:
        try:
            text = await database_sync_to_async(_stored_text)(msg.session_id, msg.msg_id)
        except DatabaseError as exc:
            log.warning("session %s: retry not read, storage down: %s", msg.session_id, exc)
            yield _storage_down(msg)
            return
        if text is None:
            yield Rejected("nothing_to_retry", "There is nothing to retry.")
            return
    if isinstance(text, str):
        text = strip_control(text)  # PostgreSQL refuses NUL; other controls are noise
    problem = check_text(text)
    if problem is not None:
        yield Rejected(*problem)
        return
    assert isinstance(text, str)
    text = text.strip()
    # Off the event loop: the crisis model's encoder takes milliseconds per message.
    assessment = await _on(SAFETY_POOL, safety.assess, text)
    if assessment.level == "crisis":
        async for event in _crisis(msg, text, assessment):
            yield event
        return
    delay, longest = HOLD_RETRY_SECONDS
    held_since: float | None = None
    while True:
        try:
            turn, created, dispatch = await database_sync_to_async(
                services.store_client_message
            )(msg.session_id, text, author=msg.author, client_msg_id=msg.msg_id,
              assessment=assessment)  # fmt: skip
            break
        except services.SessionError as exc:
            yield Rejected(exc.code, exc.message)
            return
        except DatabaseError as exc:
            now = asyncio.get_running_loop().time()
            if held_since is None:
                log.warning("session %s: message held, storage down: %s", msg.session_id, exc)
                held_since = now
                yield Held(msg.msg_id, text)
            elif now - held_since > HOLD_LIMIT_SECONDS:
                log.error("session %s: held message given up after %.0f s", msg.session_id,
                          now - held_since)  # fmt: skip
                yield _storage_down(msg)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)
    _dispatch_later(dispatch)
    _replay_spool_soon()
    yield Stored(turn, created)
    async for event in _answer_in_order(msg.session_id, turn, assessment, overrides):
        yield event


def _storage_down(msg: ClientMessage) -> Rejected:
    resend = isinstance(msg.text, str) and is_unicode_text(msg.text) and not msg.retry
    return Rejected(
        "storage_unavailable",
        "Your message could not be saved just now. Please send it again in a moment.",
        retry_msg_id=msg.msg_id if resend else "",
        resend_text=str(msg.text) if resend else "",
    )


def _unsaved_reply(reply: str) -> Turn:
    return Turn(seq=-1, role=Turn.Role.COUNSELOR, text=reply, safety_level="crisis")


async def _record_safe(
    msg: ClientMessage, text: str, assessment: safety.SafetyAssessment, reply: str
) -> services.SafeTurn:
    """The crisis transaction (message, safe reply, flag, outbox) on a thread of its own:
    never queued behind the ORM work of other sessions on the shared sync thread."""
    return await off_shared_thread(services.record_safe_reply)(  # type: ignore[no-any-return]
        msg.session_id, text, author=msg.author, client_msg_id=msg.msg_id,
        assessment=assessment, reply=reply,
    )  # fmt: skip


async def _crisis(
    msg: ClientMessage, text: str, assessment: safety.SafetyAssessment
) -> AsyncIterator[TurnEvent]:
    """The safe reply first, whatever else is happening in the session."""
    reply = safety.safe_response(str(settings.PSYEVO_SAFETY_LOCALE))
    try:
        safe = await _record_safe(msg, text, assessment, reply)
    except DatabaseError as exc:
        # PostgreSQL unreachable: the safe reply goes out from memory now; the message,
        # the reply and the flag are held here and written when storage returns.
        log.critical("session %s: crisis message held, storage down: %s", msg.session_id, exc)
        yield Replied(_unsaved_reply(reply))
        # Spooled under a message id, so that a replay and this task store it once.
        held = (
            msg if msg.msg_id else dataclasses.replace(msg, msg_id=f"held-{secrets.token_hex(8)}")
        )
        keep(asyncio.ensure_future(_write_when_storage_returns(held, text, assessment, reply)))
        return
    except Exception:
        # Anything else (a session gone, a bug): the person still gets the safe reply.
        log.critical("session %s: crisis message not stored", msg.session_id, exc_info=True)
        yield Replied(_unsaved_reply(reply))
        return
    # After the commit, and only for the messages before this one: a resend of an old
    # crisis must not stop the reply to a later message. A writer whose engine was built
    # from storage before this commit registered its flight before that read, so it is
    # stopped here; one built after it sees its message answered (``_build``).
    supersede(msg.session_id, safe.message.seq)
    keep(asyncio.ensure_future(announce_supersede(msg.session_id, safe.message.seq)))
    yield Stored(safe.message, safe.message_created)
    yield Replied(safe.reply)
    _dispatch_later(safe.dispatch)
    _replay_spool_soon()


async def _write_when_storage_returns(
    msg: ClientMessage, text: str, assessment: safety.SafetyAssessment, reply: str
) -> None:
    """Write a crisis held in memory (message, safe reply, flag, outbox) once PostgreSQL
    answers again, then send the flag's notifications. Idempotent per message id, like a
    resend. Spooled to disk first (:mod:`webapp.counseling.spool`): if this process dies
    before storage returns, the next successful write in any process sharing the spool,
    or the next process start, writes it."""
    record = spool.as_record(msg.session_id, msg.author, msg.msg_id, text, assessment, reply)
    name = await _on(NOTIFY_POOL, spool.hold, record)
    delay, longest = HOLD_RETRY_SECONDS
    while True:
        await asyncio.sleep(delay)
        try:
            safe = await _record_safe(msg, text, assessment, reply)
        except DatabaseError as exc:
            log.warning("session %s: held crisis still not written: %s", msg.session_id, exc)
            delay = min(delay * 2, longest)
            continue
        except services.SessionError as exc:
            log.critical("session %s: held crisis not written: %s", msg.session_id, exc.code)
            await _on(NOTIFY_POOL, spool.release, name)
            return
        log.warning("session %s: held crisis written (turn %s)", msg.session_id, safe.message.seq)
        await _on(NOTIFY_POOL, spool.release, name)
        await _on(NOTIFY_POOL, _run_steps, safe.dispatch)
        _replay_spool_soon()
        return


def _replay_spool_soon() -> None:
    """After a successful write: crises spooled by a process that died (or by this one,
    whose task gave up) are written now, off the event loop and off the shared pool."""
    if spool.pending():
        spool.replay_soon()


async def _open_turns(session_id: int) -> list[Turn] | None:
    """The open client turns; None while PostgreSQL is unreachable (logged)."""
    try:
        return await database_sync_to_async(services.open_client_turns)(session_id)  # type: ignore[no-any-return]
    except DatabaseError as exc:
        log.warning("session %s: database unavailable: %s", session_id, exc)
        return None


def _not_written(turn: Turn) -> Failed:
    return Failed(turn.seq, "storage_unavailable",
                  "The reply could not be written just now. Try again.", turn.client_msg_id)  # fmt: skip


async def _answer_in_order(
    session_id: int,
    own: Turn,
    assessment: safety.SafetyAssessment,
    overrides: Overrides | None,
) -> AsyncIterator[TurnEvent]:
    """Answer ``own`` once every earlier open message is answered.

    Whoever holds the session's writer answers all open messages oldest first; the others
    wait and look again, and stop once theirs is answered (or superseded). Nobody waits
    for a wake-up that could be lost: a message stored just after the writer's last look
    finds the writer free at its own next look."""
    told = False
    while True:
        waiting = await _open_turns(session_id)
        if waiting is None:
            yield _not_written(own)
            return
        if all(t.seq != own.seq for t in waiting):
            return  # answered by the writer, or superseded by a crisis
        writer = SessionWriter(session_id)
        if not await writer.try_acquire():
            if not told:
                told = True
                yield Queued(own.seq)
            await asyncio.sleep(POLL_SECONDS)
            continue
        try:
            # Looked at again now that this is the writer: the look above may predate the
            # reply of the writer that just let go (or a crisis' safe reply).
            waiting = await _open_turns(session_id)
            if waiting is None:
                yield _not_written(own)
                return
            while waiting:
                turn = waiting[0]
                verdict = assessment if turn.seq == own.seq else _assessment_of(turn)
                finished = True
                async for event in _answer(session_id, turn, verdict, overrides):
                    yield event
                    finished = finished and not isinstance(event, Failed | Paused | Withdrawn)
                if not finished:
                    return
                waiting = await _open_turns(session_id)
                if waiting is None:
                    # That reply is stored. Our own message, if still ahead, says so; the
                    # others' handlers find storage down at their own next look.
                    if turn.seq < own.seq:
                        yield _not_written(own)
                    return
        finally:
            await writer.release()
        return


async def load_pinned_adapter(version: AdapterVersion) -> None:
    """Verify ``version``'s files and load exactly the verified bytes into the backend.

    :func:`servable_path` checks the approved digest and writes the bytes into a
    snapshot; the backend gets that digest too, so an in-process loader hashes the
    snapshot again right before reading it (a change in between raises
    :class:`AdapterRefused`, nothing is loaded). A vLLM server reads the path itself,
    from the shared store (see ``VLLMBackend.load_adapter`` for what holds there).
    Raises :class:`NotServable` (never approved, or the files changed) or
    :class:`AdapterRefused`; other :class:`BackendError` s are the backend's."""
    shared = settings.PSYEVO_BACKEND == "vllm"
    path = await database_sync_to_async(servable_path)(version, shared=shared)
    await get_backend().load_adapter(version.name, str(path), sha256=version.approved_sha256)


async def _answer(
    session_id: int,
    turn: Turn,
    assessment: safety.SafetyAssessment,
    overrides: Overrides | None,
) -> AsyncIterator[TurnEvent]:
    """One reply to one stored client turn (the caller holds the session's writer).

    The flight is registered BEFORE the engine is built from storage: a crisis that
    commits after that read stops it; one that committed before it is seen by it."""
    flight = _Flight(session_id, turn.seq)
    _flights.setdefault(session_id, set()).add(flight)
    try:
        async for event in _answer_flight(session_id, turn, assessment, overrides, flight):
            yield event
    finally:
        _flights.get(session_id, set()).discard(flight)
        if not _flights.get(session_id):
            _flights.pop(session_id, None)


async def _answer_flight(
    session_id: int,
    turn: Turn,
    assessment: safety.SafetyAssessment,
    overrides: Overrides | None,
    flight: _Flight,
) -> AsyncIterator[TurnEvent]:
    retry = turn.client_msg_id
    try:
        built = await database_sync_to_async(_build)(session_id, turn.seq, overrides)
    except DatabaseError as exc:
        log.warning("session %s: engine not rebuilt, database unavailable: %s", session_id, exc)
        yield Failed(turn.seq, "storage_unavailable",
                     "The reply could not be written just now. Try again.", retry)  # fmt: skip
        return
    except Exception:
        log.exception("session %s: engine rebuild failed", session_id)
        yield Failed(turn.seq, "internal_error", "Something went wrong. Try again.", retry)
        return
    if built is None:
        return  # answered meanwhile: nothing was shown for it
    counselor, paused, version = built
    if paused:
        yield Paused(turn.seq)
        return
    if version is not None:
        try:
            await load_pinned_adapter(version)
        except (NotServable, AdapterRefused) as exc:
            # Never fall back silently: the session is pinned to a version a clinician
            # approved, and files that no longer match it must not serve anyone.
            log.critical("session %s: adapter refused: %s", session_id, exc)
            yield Failed(turn.seq, "adapter_refused",
                         "The counselor is unavailable right now. Your message is kept.", retry)  # fmt: skip
            return
        except BackendError as exc:  # the engine then answers with an error event
            log.warning("session %s: cannot load %s: %s", session_id, version.name, exc)
    reply_seq = turn.seq + 1
    if flight.stop.is_set():  # a crisis came in while the engine was being built
        _record_superseded(session_id, turn, "stopped before it was written")
        return
    yield Writing(reply_seq)
    events = counselor.respond(turn.text, assessment=assessment)
    tokens = 0
    try:
        while True:
            try:
                event = await _next_unless_stopped(events, flight)
            except Exception:
                # Never let an engine bug kill the socket: the message is stored, so the
                # page offers a retry, and the traceback goes to the log, not the page.
                log.exception("reply to turn %s of session %s failed", turn.seq, session_id)
                yield Failed(reply_seq, "internal_error", "Something went wrong. Try again.", retry)
                return
            if event is None:
                yield Failed(reply_seq, "internal_error", "Something went wrong. Try again.", retry)
                return
            if event is _SUPERSEDED:
                _record_superseded(session_id, turn, "stopped while written")
                yield Withdrawn(reply_seq)
                return
            if isinstance(event, TokenEvent):
                yield Token(reply_seq, tokens, event.text)
                tokens += 1
            elif isinstance(event, ProgressEvent):
                yield Progress(reply_seq, event.stage, event.done, event.total)
            elif isinstance(event, ErrorEvent):
                yield Failed(reply_seq, event.code, event.message, retry if event.retryable else "")
                return
            elif isinstance(event, DoneEvent):
                async for outcome in _commit(session_id, turn, event, reply_seq):
                    yield outcome
                return
            # SkillEvent, SafetyEvent: the flag was raised when the message was stored.
    finally:
        with contextlib.suppress(Exception):
            await events.aclose()  # type: ignore[attr-defined]


def _write_superseded(session_id: int, seq: int, how: str) -> None:
    try:
        session = Session.objects.select_related("client").get(pk=session_id)
        audit.record(
            None, "turn.superseded", subject=session.client, target=f"session:{session_id}",
            turn=seq, how=how,
        )  # fmt: skip
    except DatabaseError as exc:
        log.warning("session %s: superseded reply to turn %s not recorded: %s",
                    session_id, seq, exc)  # fmt: skip


def _record_superseded(session_id: int, turn: Turn, how: str) -> None:
    """A reply that was being written and will never be shown: an audit row says so (the
    clinician's review shows the message with no reply, and this is why)."""
    log.info("session %s: reply to turn %s superseded (%s)", session_id, turn.seq, how)
    keep(
        asyncio.ensure_future(
            off_shared_thread(_write_superseded, NOTIFY_POOL)(session_id, turn.seq, how)
        )
    )


async def _commit(
    session_id: int, turn: Turn, event: DoneEvent, reply_seq: int
) -> AsyncIterator[TurnEvent]:
    try:
        stored = await database_sync_to_async(services.record_counselor_turn)(
            session_id, event.reply, decision=event.decision, group=event.group,
            safety_level=event.safety_level, in_reply_to=turn.seq,
        )  # fmt: skip
    except services.Superseded:
        _record_superseded(session_id, turn, "refused at commit")
        yield Withdrawn(reply_seq)
        return
    except services.SessionError as exc:
        log.info("session %s: reply to turn %s not stored: %s", session_id, turn.seq, exc.code)
        yield Failed(reply_seq, exc.code, exc.message)
        return
    except DatabaseError as exc:
        log.warning("session %s: reply not stored: %s", session_id, exc)
        yield Failed(reply_seq, "storage_unavailable",
                     "The reply could not be saved just now. Try again.", turn.client_msg_id)  # fmt: skip
        return
    if event.fallback and event.group is not None:
        # The engine's output guard let no candidate through whole: the client got the
        # fallback (stored as the reply); the verdicts are on the group for the review.
        rules = sorted({r for v in event.group.guard for r in v.get("rules", ())})
        log.warning("session %s: turn %s answered with the output guard's fallback (%s)",
                    session_id, stored.seq, ", ".join(rules))  # fmt: skip
    yield Replied(stored)


# -- the other writers of a session ---------------------------------------------------------------
async def clinician_message(
    session_id: int, author: Any, text: object, msg_id: str
) -> AsyncIterator[TurnEvent]:
    """A clinician's message: validated like a client's, stored, shown. No engine."""
    if not valid_msg_id(msg_id):
        yield Rejected("bad_message_id", "That message could not be read.")
        return
    if isinstance(text, str):
        text = strip_control(text)
    problem = check_text(text)
    if problem is not None:
        yield Rejected(*problem)
        return
    assert isinstance(text, str)
    try:
        turn, created = await database_sync_to_async(services.append_turn)(
            session_id, Turn.Role.CLINICIAN, text.strip(), author=author, client_msg_id=msg_id
        )
    except services.SessionError as exc:
        yield Rejected(exc.code, exc.message)
        return
    yield Stored(turn, created)


async def end_session(
    session_id: int, rating: Rating | None, *, overrides: dict[str, Any] | None = None
) -> Any:
    """The session end. A reply still being written finds the session ENDED when it
    commits and stores nothing; once the end is committed, the ones written in this
    process also stop streaming (other processes stop on the session-end broadcast).
    Returns the engine's ``SessionOutcome``.

    Its callers are synchronous at heart (the end view through ``async_to_sync``, the
    simulation lab's command), so the ORM work runs on the caller's own thread and
    connection (``sync_to_async``): ``database_sync_to_async`` would close that
    connection in the middle of the view's request (and of a test's transaction)."""
    counselor, session = await sync_to_async(counselor_for)(session_id, "end", overrides=overrides)
    # Memory consent is read at the point of use: withdrawn, no recap is even drafted.
    recap = await sync_to_async(memory_services.memory_consented)(session.client)
    outcome = await counselor.end_session(rating, recap=recap)
    await sync_to_async(services.finish_session)(session_id, outcome, rating)
    supersede(session_id)
    return outcome
