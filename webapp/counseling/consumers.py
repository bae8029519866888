"""The counseling socket: one per open chat page, one channel group per session.

Authorization happens in ``connect``, on every incoming message, and on a timer, so a
socket closes within ``WS_REAUTH_SECONDS`` of logout or account disable. The consumer
parses and authorizes; sessions, turns and evidence are written by ``services`` and the
reply comes from the engine, rebuilt from PostgreSQL for each message (no state lives
here that another server would miss).

A message while a reply is being written is refused (a Redis key per session marks the
reply in progress, so this holds across tabs and server processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import weakref
from collections import deque
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.db import DatabaseError
from django.db import connection as db_connection

from counselor_engine import safety, safety_model
from counselor_engine.backends import BackendError
from counselor_engine.counselor import (
    Counselor,
    DoneEvent,
    ErrorEvent,
    ProgressEvent,
    SafetyEvent,
    TokenEvent,
)
from counselor_engine.text import strip_control
from webapp.counseling import frames, services
from webapp.counseling.models import Session, Turn
from webapp.counseling.runtime import counselor_for, get_backend
from webapp.learning.models import AdapterVersion
from webapp.learning.services import NotServable, servable_path
from webapp.oversight import audit
from webapp.oversight.models import ClientControl

log = logging.getLogger(__name__)
security_log = logging.getLogger("psyevo.security")

CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_BIG = 1009
CLOSE_POLICY = 1008
MAX_MSG_ID = 64
# A message that could not be stored (PostgreSQL unreachable) is refused with this, never
# dropped silently: the page offers "Send again" with the same text and id.
STORAGE_DOWN = (
    "storage_unavailable",
    "Your message could not be saved just now. Please send it again in a moment.",
)

# A resync whose turns could not be read: the socket stays open (closing it would only
# reconnect into the same outage) and the page keeps what it shows.
RESYNC_DOWN = (
    "storage_unavailable",
    "Earlier messages could not be loaded just now. They will appear when storage is back.",
)

# Reply writers outlive their consumer when the page goes away mid-reply (the reply is
# still stored); the loop keeps only weak references to tasks, so we keep strong ones.
_writers: set[asyncio.Task[None]] = set()


def session_group(session_id: int) -> str:
    return f"session.{session_id}"


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


class ReplyLock:
    """Marks "a reply is being written" for a session, across processes.

    The mark is a short lease renewed while the reply is written: a server process that
    dies mid-reply leaves it for at most ``LEASE_SECONDS``, after which the client's resend
    (through any server) gets its reply instead of "busy" for the whole backend timeout."""

    LEASE_SECONDS = 15
    _RENEW = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then "
        "return redis.call('expire', KEYS[1], ARGV[2]) end return 0"
    )
    _RELEASE = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
        "return 0"
    )

    def __init__(self, session_id: int) -> None:
        self.key = reply_key(session_id)
        self.token = secrets.token_hex(8)
        self._renewer: asyncio.Task[None] | None = None

    # The final frame of a reply reaches the page a moment before its writer releases the
    # mark, so a message sent at once (the page enables Send on that frame) waits this long
    # for the mark before it is refused as "busy".
    GRACE_SECONDS = 1.0

    async def acquire(self) -> bool:
        deadline = asyncio.get_running_loop().time() + self.GRACE_SECONDS
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


# Turn seqs are PostgreSQL integers; a larger resync point would fail the query.
MAX_SEQ = 2**31 - 1


def resync_point(after: Any) -> int | None:
    """The seq a resync asks for turns after: -1 when missing (from the start), None when
    it is not a whole number in [-1, MAX_SEQ] (NaN, Infinity, text, 1e300, -5)."""
    if after is None:
        return -1
    if isinstance(after, float) and after.is_integer():
        after = int(after)
    if isinstance(after, bool) or not isinstance(after, int) or not -1 <= after <= MAX_SEQ:
        return None
    return after


def _record_crisis_in_worker(
    session_id: int, turn: Turn, assessment: safety.SafetyAssessment
) -> None:
    """``services.record_crisis`` on a pool thread, whose connection is closed after: the
    pool keeps the thread, and an idle connection left there would outlive the socket."""
    try:
        services.record_crisis(session_id, turn, assessment)
    finally:
        db_connection.close()


def warm_crisis_model() -> None:
    """The crisis model (safety's learned layer) takes seconds to load: the ASGI entry point
    loads it at start-up, not on the first client message, which may be a crisis.

    Not at import: Celery workers import this module too, and a prefork worker whose main
    process has started torch threads deadlocks its forked pool child in torch (a training
    round hung in its load phase).

    In the calling thread, before the server serves anything: loading it in a background
    thread raced other threads importing transformers (the lazy module then failed with
    "cannot import name ..." in whichever thread lost)."""
    safety_model.warm()


def _log_flag_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.critical("safety flag could not be stored", exc_info=task.exception())


class SessionConsumer(AsyncWebsocketConsumer):
    _reply_lock: ReplyLock | None = None  # held by the reply being written on this socket

    # Channels' dispatch loop awaits ``self.channel_receive`` (the channel layer) next to
    # the socket; a Redis error there ends the consumer and closes the socket, so a client
    # in distress would lose the chat while Redis is down. The property keeps channels'
    # callable and hands the loop one that waits out the outage instead.
    @property
    def channel_receive(self) -> Any:
        return self._receive_through_outages

    @channel_receive.setter
    def channel_receive(self, receive: Any) -> None:
        self._layer_receive = receive

    async def _receive_through_outages(self) -> dict[str, Any]:
        delay = 0.5
        while True:
            try:
                return await self._layer_receive()  # type: ignore[no-any-return]
            except (OSError, aioredis.RedisError) as exc:
                log.warning("channel layer receive failed, retrying in %.1f s: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        if user is None or not user.is_authenticated or not user.is_active:
            security_log.warning("denied socket user=anonymous session=%s", self.session_id)
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.user = user
        self.django_session_key = getattr(self.scope.get("session"), "session_key", None)
        role = await self._role_in_session()
        if role is None:
            security_log.warning("denied socket user=%s session=%s", user.username, self.session_id)
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.role = role
        self.group = session_group(self.session_id)
        self.recent: deque[float] = deque()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.reauth_task = asyncio.create_task(self._reauth_loop())
        self.inbox: asyncio.Queue[tuple[dict[str, Any], bool] | None] = asyncio.Queue()
        self.replying = False
        writer = asyncio.create_task(self._write_replies())
        _writers.add(writer)
        writer.add_done_callback(_writers.discard)
        if role == "clinician":
            # Takeover is always visible to the client, and audited.
            await self._audit_join()
            await self._broadcast(frames.control_frame(-1, paused=False, clinician_present=True))

    @database_sync_to_async
    def _audit_join(self) -> None:
        session = Session.objects.select_related("client").get(pk=self.session_id)
        audit.record(
            self.user, "session.join", subject=session.client, target=f"session:{session.pk}"
        )

    async def disconnect(self, code: int) -> None:
        task = getattr(self, "reauth_task", None)
        if task is not None:
            task.cancel()
        if hasattr(self, "inbox"):
            self.inbox.put_nowait(None)  # the writer ends after the reply in progress
        if hasattr(self, "group"):
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except (OSError, aioredis.RedisError) as exc:  # Redis down: the membership expires
                log.warning("session %s: could not leave the group: %s", self.session_id, exc)

    # -- authorization ---------------------------------------------------------------------
    @database_sync_to_async
    def _role_in_session(self) -> str | None:
        """'client' or 'clinician' when this user may use this session's socket."""
        from webapp.accounts.models import User

        user = User.objects.filter(pk=self.user.pk, is_active=True).first()
        if user is None:
            return None
        if self.django_session_key and not SessionStore().exists(self.django_session_key):
            return None  # logged out: the Django session row is gone
        session = Session.objects.filter(pk=self.session_id).first()
        if session is None:
            return None
        if user.role == "client" and services.client_may_open(user, session):
            return "client"
        if user.role == "clinician" and services.clinician_may_open(user, session):
            return "clinician"
        return None

    async def _reauth_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.WS_REAUTH_SECONDS)
            if await self._role_in_session() is None:
                await self.close(code=CLOSE_UNAUTHORIZED)
                return

    # -- incoming --------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        size = len(text_data.encode()) if text_data is not None else len(bytes_data or b"")
        if size > settings.WS_MAX_FRAME_BYTES:
            await self.close(code=CLOSE_TOO_BIG)
            return
        now = time.monotonic()
        self.recent.append(now)
        while self.recent and now - self.recent[0] > settings.WS_RATE_WINDOW_SECONDS:
            self.recent.popleft()
        if len(self.recent) > settings.WS_RATE_LIMIT:
            await self.send(
                frames.error_frame(-1, "rate_limited", "Too many messages. Please slow down.")
            )
            await self.close(code=CLOSE_POLICY)
            return
        if text_data is None:
            await self.send(frames.error_frame(-1, "not_text", "Send text frames only."))
            return
        try:
            data = json.loads(text_data)
        except ValueError:
            await self.send(frames.error_frame(-1, "bad_json", "That message could not be read."))
            return
        if not isinstance(data, dict):
            await self.send(frames.error_frame(-1, "bad_json", "That message could not be read."))
            return
        try:
            role = await self._role_in_session()
        except DatabaseError as exc:  # PostgreSQL unreachable: refuse, never drop silently
            log.warning(
                "session %s: message refused, database unavailable: %s", self.session_id, exc
            )
            await self._refuse_unstored(data)
            return
        if role is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        kind = data.get("type", "message")
        if kind == "resync":
            try:
                await self._resync(data.get("after_seq"))
            except DatabaseError as exc:  # PostgreSQL went away mid-resync: say so, stay open
                log.warning("session %s: resync failed, database unavailable: %s", self.session_id, exc)
                await self.send(frames.error_frame(-1, *RESYNC_DOWN))
        elif kind in ("message", "retry"):
            if self.replying:
                await self.send(
                    frames.error_frame(
                        -1, "busy", "Please wait until the counselor's reply is finished."
                    )
                )
                return
            self.replying = True
            self.inbox.put_nowait((data, kind == "retry"))
        elif kind == "ping":
            await self.send(frames.status_frame(-1, ""))
        else:
            await self.send(frames.error_frame(-1, "unknown_type", "Unknown message type."))

    async def _refuse_unstored(
        self, data: dict[str, Any], problem: tuple[str, str] = STORAGE_DOWN
    ) -> None:
        """An error frame whose "Send again" carries the message's text and id (a resend
        of a message that was stored after all is answered, never stored twice)."""
        text, msg_id = data.get("text"), data.get("client_msg_id")
        resend = isinstance(text, str) and is_unicode_text(text) and valid_msg_id(msg_id)
        resend = resend and data.get("type", "message") == "message"
        await self.send(
            frames.error_frame(
                -1,
                *problem,
                retry_msg_id=str(msg_id) if resend else "",
                resend_text=str(text) if resend else "",
            )
        )

    async def _resync(self, after: Any) -> None:
        after_seq = resync_point(after)
        if after_seq is None:
            await self.send(frames.error_frame(-1, "bad_seq", "That resync could not be read."))
            return
        turns, paused = await self._turns_after(after_seq)
        for turn in turns:
            await self.send(frames.turn_frame(turn))
        await self.send(frames.control_frame(-1, paused=paused, clinician_present=False))
        await self._offer_interrupted_reply(paused)

    async def _offer_interrupted_reply(self, paused: bool) -> None:
        """The session's last turn is a client message with no reply, and no server is
        writing one (its process died mid-reply): offer "Try again" instead of silence."""
        if paused or self.role != "client":
            return
        last = await self._last_turn()
        if last is None or last.role != Turn.Role.CLIENT or not last.client_msg_id:
            return
        try:
            if await redis_client().exists(reply_key(self.session_id)):
                return  # a reply is being written (on this server or another)
        except Exception as exc:
            log.warning("reply lock unavailable (Redis): %s", exc)
        await self.send(
            frames.error_frame(
                last.seq,
                "reply_interrupted",
                "The counselor's reply was interrupted. Try again.",
                retry_msg_id=last.client_msg_id,
            )
        )

    @database_sync_to_async
    def _last_turn(self) -> Turn | None:
        return Turn.objects.filter(session_id=self.session_id).order_by("-seq").first()

    @database_sync_to_async
    def _turns_after(self, seq: int) -> tuple[list[Turn], bool]:
        session = Session.objects.get(pk=self.session_id)
        control = ClientControl.objects.filter(client_id=session.client_id).first()
        return list(session.turns.filter(seq__gt=seq).order_by("seq")), bool(
            control and control.ai_paused
        )

    async def _write_replies(self) -> None:
        """This socket's messages, one at a time, outside the consumer's dispatch loop.

        A consumer handles one event at a time: a reply written inside ``receive`` would
        hold back the frames it broadcasts to its own group (``chat.frame``) until the
        reply is over, so the page got the whole reply at once, and a reply of more
        frames than the channel's capacity lost its last ones, the final turn among them."""
        while (item := await self.inbox.get()) is not None:
            data, retry = item
            try:
                await self._on_message(data, retry=retry)
            except DatabaseError as exc:
                # PostgreSQL went away while storing the message or its reply: say so,
                # with a resend carrying the same id (stored once whatever happened).
                log.warning("session %s: database unavailable: %s", self.session_id, exc)
                with contextlib.suppress(Exception):
                    await self._refuse_unstored(data)
            except Exception:
                log.exception("session %s: message failed", self.session_id)
                with contextlib.suppress(Exception):  # the socket may be gone
                    await self._refuse_unstored(
                        data, ("internal_error", "Something went wrong. Try again.")
                    )
            finally:
                if self.inbox.empty():  # else the next message, queued at _end_reply, runs now
                    self.replying = False

    async def _on_message(self, data: dict[str, Any], *, retry: bool) -> None:
        text = data.get("text", "")
        msg_id = data.get("client_msg_id") or ""
        if not valid_msg_id(msg_id):
            await self.send(
                frames.error_frame(-1, "bad_message_id", "That message could not be read.")
            )
            return
        if retry:
            text = await self._stored_text(msg_id)
            if text is None:
                await self.send(
                    frames.error_frame(-1, "nothing_to_retry", "There is nothing to retry.")
                )
                return
        if isinstance(text, str):
            text = strip_control(text)  # PostgreSQL refuses NUL; other controls are noise
        problem = self._check_text(text)
        if problem is not None:
            await self.send(frames.error_frame(-1, *problem))
            return
        if self.role == "clinician":
            await self._clinician_message(text, msg_id)
            return
        lock = ReplyLock(self.session_id)
        try:
            acquired = await lock.acquire()
        except Exception as exc:
            log.warning("reply lock unavailable (Redis): %s", exc)
            acquired = (
                True  # Redis down must not block a client in distress; one socket still serialises
            )
            lock = None  # type: ignore[assignment]
        if not acquired:
            await self.send(
                frames.error_frame(
                    -1, "busy", "Please wait until the counselor's reply is finished."
                )
            )
            return
        self._reply_lock = lock
        try:
            await self._client_message(text, msg_id)
        finally:
            await self._end_reply()

    async def _end_reply(self) -> None:
        """Let the session take its next message. Called once the reply (or its failure)
        is stored, before the frame that re-enables the page's Send button goes out: a
        message sent on that frame must find the session free, even on a loaded server
        (it is queued behind what is left of this reply: the inbox keeps the order)."""
        self.replying = False
        lock, self._reply_lock = self._reply_lock, None
        if lock is not None:
            try:
                await lock.release()
            except Exception as exc:
                log.warning("could not release reply lock: %s", exc)

    def _check_text(self, text: Any) -> tuple[str, str] | None:
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

    @database_sync_to_async
    def _stored_text(self, msg_id: str) -> str | None:
        if not msg_id:
            return None
        turn = Turn.objects.filter(
            session_id=self.session_id, client_msg_id=msg_id, role="client"
        ).first()
        return None if turn is None else turn.text

    async def _clinician_message(self, text: str, msg_id: str) -> None:
        turn, created = await database_sync_to_async(services.append_turn)(
            self.session_id,
            Turn.Role.CLINICIAN,
            text.strip(),
            author=self.user,
            client_msg_id=msg_id,
        )
        if created:
            await self._broadcast(frames.turn_frame(turn))

    async def _client_message(self, text: str, msg_id: str) -> None:
        try:
            turn, created = await database_sync_to_async(services.append_turn)(
                self.session_id,
                Turn.Role.CLIENT,
                text.strip(),
                author=self.user,
                client_msg_id=msg_id,
            )
        except services.SessionError as exc:
            await self.send(frames.error_frame(-1, exc.code, exc.message))
            return
        if created:
            await self._broadcast(frames.turn_frame(turn))
        elif await self._already_answered(turn):
            return  # a resend of a message that already has its reply
        # Safety first: a crisis gets the fixed safe reply and an alert whatever the state
        # of the model, the adapter files or the AI pause. Off the event loop: the crisis
        # model's encoder takes milliseconds per message (the engine's own check then hits
        # its verdict cache).
        crisis = (await asyncio.to_thread(safety.assess, turn.text)).level == "crisis"
        counselor, paused, version = await self._build_counselor(turn)
        if paused and not crisis:
            await self._broadcast(
                frames.control_frame(turn.seq, paused=True, clinician_present=True)
            )
            return
        if version is not None and not crisis:
            try:
                path = await database_sync_to_async(servable_path)(version)
            except NotServable as exc:
                # Never fall back silently: the session is pinned to a version a clinician
                # approved, and files that no longer match it must not serve anyone.
                log.critical("session %s: adapter refused: %s", self.session_id, exc)
                await self.send(
                    frames.error_frame(
                        turn.seq,
                        "adapter_refused",
                        "The counselor is unavailable right now. Your message is kept.",
                        retry_msg_id=msg_id,
                    )
                )
                return
            try:
                await get_backend().load_adapter(version.name, str(path))
            except BackendError as exc:
                # The engine then answers with an error event and a retry.
                log.warning("session %s: cannot load %s: %s", self.session_id, version.name, exc)
        reply_seq = turn.seq + 1
        await self._broadcast(
            frames.pending_frame(reply_seq)
            + frames.status_frame(reply_seq, "The counselor is writing…", busy=True)
        )
        try:
            await self._relay(counselor, turn, reply_seq, msg_id)
        except Exception as exc:
            # Never let an engine bug kill the socket: the client turn is stored, so the
            # page offers a retry, and the traceback goes to the log, not the page.
            log.exception("reply to turn %s of session %s failed", turn.seq, self.session_id)
            code, message = (
                ("storage_unavailable", "The reply could not be saved just now. Try again.")
                if isinstance(exc, DatabaseError)
                else ("internal_error", "Something went wrong. Try again.")
            )
            await self._end_reply()
            await self._broadcast(
                '<div id="pending" hx-swap-oob="innerHTML"></div>'
                + frames.error_frame(reply_seq, code, message, retry_msg_id=msg_id)
            )

    async def _relay(self, counselor: Counselor, turn: Turn, reply_seq: int, msg_id: str) -> None:
        """Forward engine events to every tab of the session; commit what must persist."""
        tokens = 0
        async for event in counselor.respond(turn.text):
            if isinstance(event, SafetyEvent):
                self._flag_beside_reply(turn, event.assessment)
            elif isinstance(event, ProgressEvent):
                await self._broadcast(
                    frames.progress_frame(reply_seq, event.stage, event.done, event.total)
                )
            elif isinstance(event, TokenEvent):
                await self._broadcast(frames.token_frame(reply_seq, tokens, event.text))
                tokens += 1
            elif isinstance(event, ErrorEvent):
                retry = msg_id if event.retryable else ""
                await self._end_reply()
                await self._broadcast(
                    '<div id="pending" hx-swap-oob="innerHTML"></div>'
                    + frames.error_frame(reply_seq, event.code, event.message, retry_msg_id=retry)
                )
                return
            elif isinstance(event, DoneEvent):
                stored = await database_sync_to_async(services.record_counselor_turn)(
                    self.session_id,
                    event.reply,
                    decision=event.decision,
                    group=event.group,
                    safety_level=event.safety_level,
                )
                await self._end_reply()
                await self._broadcast(
                    frames.turn_frame(stored) + frames.status_frame(stored.seq, "")
                )

    def _flag_beside_reply(self, turn: Turn, assessment: safety.SafetyAssessment) -> None:
        """Store the safety flag and send its alerts beside the reply, not before it.

        With Redis or the Celery broker down, the alert plumbing (live push, email task,
        escalation task) takes seconds to give up, and the safe reply must not wait for it.
        Its own thread, so the reply's database writes do not queue behind it; a strong
        reference (``_writers``) keeps it alive if the socket goes away."""
        record = database_sync_to_async(_record_crisis_in_worker, thread_sensitive=False)
        task = asyncio.ensure_future(record(self.session_id, turn, assessment))
        _writers.add(task)
        task.add_done_callback(_writers.discard)
        task.add_done_callback(_log_flag_failure)

    @database_sync_to_async
    def _already_answered(self, turn: Turn) -> bool:
        return (
            Turn.objects.filter(session_id=turn.session_id, seq__gt=turn.seq)
            .exclude(role="client")
            .exists()
        )

    @database_sync_to_async
    def _build_counselor(self, turn: Turn) -> tuple[Counselor, bool, AdapterVersion | None]:
        """Rebuild the engine for this session from storage (stateless across servers).

        Returns the counselor, whether the AI is paused for this client, and the adapter
        version the session pinned (its files are verified before it is loaded)."""
        counselor, session = counselor_for(self.session_id, turn.seq)
        control = ClientControl.objects.filter(client_id=session.client_id).first()
        version = session.adapter_version
        return counselor, bool(control and control.ai_paused), version

    async def _broadcast(self, frame: str) -> None:
        """Send a frame to every tab of the session.

        This socket gets it directly; the group (other tabs, on any server) through the
        channel layer, tagged with its origin so this socket skips its own copy. Going
        through Redis for the writer's own socket put every token behind the process's
        single channel-layer receive loop: with 200 sessions, bursts of tokens waited
        seconds there (bench/bench_ws.py)."""
        with contextlib.suppress(Exception):  # a closed socket: the reply is still committed
            await self.send(frame)
        try:
            await self.channel_layer.group_send(
                self.group, {"type": "chat.frame", "html": frame, "origin": self.channel_name}
            )
        except Exception as exc:  # Redis unreachable: this socket already has the frame;
            # the session's other tabs get it from their resync when they reconnect.
            log.warning("session %s: channel layer unavailable: %s", self.session_id, exc)

    async def chat_frame(self, event: dict[str, Any]) -> None:
        if event.get("origin") == self.channel_name:
            return  # sent to this socket directly by _broadcast
        await self.send(event["html"])

    async def chat_close(self, event: dict[str, Any]) -> None:
        """Sent by the session-end view so every open tab learns the session is over."""
        await self.send(event.get("html", ""))
        await self.close(code=1000)
