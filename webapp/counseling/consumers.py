"""The counseling socket: one per open chat page, one channel group per session.

Transport only: authorization (in ``connect``, on every incoming message, and on a timer,
so a socket closes within ``WS_REAUTH_SECONDS`` of logout or account disable), origin,
size and rate limits, framing, resync and broadcast. Every message goes to the turn API
(``webapp.counseling.turns``), which stores it, assesses it and answers it; this consumer
turns its events into frames. A message is never refused because a reply is being
written: it is stored at once and answered in order (a crisis at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from counselor_engine.safety import registry
from webapp.accounts.models import User
from webapp.accounts.socket_auth import login_still_valid
from webapp.counseling import services, turns
from webapp.counseling.models import Session, Turn
from webapp.counseling.turns import redis_client, reply_key, reply_view_key
from webapp.lib import audit, frames
from webapp.lib.groups import session_group
from webapp.oversight.console import review_consented
from webapp.oversight.models import ClientControl

log = logging.getLogger(__name__)
security_log = logging.getLogger("psyevo.security")

CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_BIG = 1009
CLOSE_POLICY = 1008
# Replies and flag notifications outlive their socket: the turn API keeps them alive.
_writers = turns.background


# A resync whose turns could not be read: the socket stays open (closing it would only
# reconnect into the same outage) and the page keeps what it shows.
RESYNC_DOWN = (
    "storage_unavailable",
    "Earlier messages could not be loaded just now. They will appear when storage is back.",
)

# Turn seqs are PostgreSQL integers; a larger resync point would fail the query.
MAX_SEQ = 2**31 - 1
# How long the last reply-in-progress frames are kept for tabs that open meanwhile: longer
# than any step of a judged reply without a progress event (a whole generate call).
WRITING_VIEW_SECONDS = 900


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


def warm_crisis_model() -> None:
    """The crisis model (safety's learned layer) takes seconds to load: the ASGI entry point
    loads it at start-up, not on the first client message, which may be a crisis.

    Not at import: Celery workers import this module too, and a prefork worker whose main
    process has started torch threads deadlocks its forked pool child in torch (a training
    round hung in its load phase).

    In the calling thread, before the server serves anything: loading it in a background
    thread raced other threads importing transformers (the lazy module then failed with
    "cannot import name ..." in whichever thread lost)."""
    registry.warm()


class SessionConsumer(AsyncWebsocketConsumer):
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
        try:
            await self.channel_layer.group_add(self.group, self.channel_name)
        except Exception as exc:
            # Redis down: the chat works without the group (a crisis gets its safe reply
            # on this socket); other tabs' frames arrive once the join succeeds.
            log.warning("session %s: cannot join the group yet: %s", self.session_id, exc)
            turns.keep(asyncio.create_task(self._join_group_later()))
        await self.accept()
        self.reauth_task = asyncio.create_task(self._reauth_loop())
        self.inbox: asyncio.Queue[tuple[dict[str, Any], bool] | None] = asyncio.Queue()
        turns.keep(asyncio.create_task(self._take_messages()))
        if role == "clinician":
            # Takeover is always visible to the client, and audited.
            await self._audit_join()
            await self._broadcast(frames.control_frame(-1, paused=False, clinician_present=True))

    async def _join_group_later(self) -> None:
        delay = 0.5
        while not getattr(self, "closed_by_disconnect", False):
            await asyncio.sleep(delay)
            try:
                await self.channel_layer.group_add(self.group, self.channel_name)
                return
            except Exception as exc:
                log.warning("session %s: group join failed again: %s", self.session_id, exc)
                delay = min(delay * 2, 10.0)

    @database_sync_to_async
    def _audit_join(self) -> None:
        session = Session.objects.select_related("client").get(pk=self.session_id)
        audit.record(
            self.user, "session.join", subject=session.client, target=f"session:{session.pk}"
        )

    async def disconnect(self, code: int) -> None:
        self.closed_by_disconnect = True
        task = getattr(self, "reauth_task", None)
        if task is not None:
            task.cancel()
        if hasattr(self, "inbox"):
            self.inbox.put_nowait(None)  # replies in progress go on (they are stored)
        if hasattr(self, "group"):
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except (OSError, aioredis.RedisError) as exc:  # Redis down: the membership expires
                log.warning("session %s: could not leave the group: %s", self.session_id, exc)

    # -- authorization ---------------------------------------------------------------------
    async def _role_in_session(self, touch: bool = False) -> str | None:
        """:meth:`_check_role` on a thread of the turn's safety pool: every message waits
        for this check, and on the process's one shared ORM thread it queued behind the
        other sessions' database work (a crisis took 3 s to be answered under load in the
        soak, its p50 0.4 s)."""
        return await turns.off_shared_thread(self._check_role)(touch)  # type: ignore[no-any-return]

    def _check_role(self, touch: bool = False) -> str | None:
        """'client' or 'clinician' when this user may use this session's socket: still
        active and logged in (not logged out, expired, idle past the staff limit or
        behind a changed password), and, for a clinician, allowed to see this client's
        words (assigned or covering, and the client consents to clinician review; a
        crisis flag still reaches the clinician through the alert, with its turn only)."""
        user = User.objects.filter(pk=self.user.pk, is_active=True).first()
        if user is None or not login_still_valid(self.django_session_key, user, touch=touch):
            return None
        session = Session.objects.select_related("client").filter(pk=self.session_id).first()
        if session is None:
            return None
        if user.role == "client" and services.client_may_open(user, session):
            return "client"
        if (
            user.role == "clinician"
            and services.clinician_may_open(user, session)
            and review_consented(session.client)
        ):
            return "clinician"
        return None

    async def _reauth_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.WS_REAUTH_SECONDS)
            try:
                role = await self._role_in_session()
            except DatabaseError as exc:  # PostgreSQL away: keep checking, never stop
                log.warning("session %s: re-check unavailable: %s", self.session_id, exc)
                continue
            if role is None:
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
            role: str | None = await self._role_in_session(touch=True)
        except DatabaseError as exc:
            # PostgreSQL unreachable: the socket was authorized at connect (and the timer
            # rechecks it); the message must still reach the turn API, which answers a
            # crisis without storage and offers anything else back to send again.
            log.warning("session %s: authorization check unavailable: %s", self.session_id, exc)
            role = self.role
        if role is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        kind = data.get("type", "message")
        if kind == "resync":
            try:
                await self._resync(data.get("after_seq"))
            except DatabaseError as exc:  # PostgreSQL went away mid-resync: say so, stay open
                log.warning(
                    "session %s: resync failed, database unavailable: %s", self.session_id, exc
                )
                await self.send(frames.error_frame(-1, *RESYNC_DOWN))
        elif kind in ("message", "retry"):
            # Never "busy": the turn API stores it at once and answers it in order.
            self.inbox.put_nowait((data, kind == "retry"))
        elif kind == "ping":
            await self.send(frames.status_frame(-1, ""))
        else:
            await self.send(frames.error_frame(-1, "unknown_type", "Unknown message type."))

    async def _resync(self, after: Any) -> None:
        after_seq = resync_point(after)
        if after_seq is None:
            await self.send(frames.error_frame(-1, "bad_seq", "That resync could not be read."))
            return
        stored, paused = await self._turns_after(after_seq)
        for turn in stored:
            await self.send(frames.turn_frame(turn))
        await self.send(frames.control_frame(-1, paused=paused, clinician_present=False))
        await self._show_reply_in_progress(paused)

    async def _show_reply_in_progress(self, paused: bool) -> None:
        """The session's last turn is a client message with no reply. While a server is
        writing it, show this tab what the others show (the writing bubble and the latest
        status or progress): a page opened or reloaded mid-reply otherwise sat silent until
        the reply landed, minutes for a judged reply on a CPU. When no server is writing
        it (its process died mid-reply), offer "Try again" instead of silence.

        In ``stream_first`` the bubble fills from the next streamed sentence on; the whole
        reply replaces it when it lands."""
        last = await self._last_turn()
        if last is None or last.role != Turn.Role.CLIENT:
            return
        try:
            redis = redis_client()
            if await redis.exists(reply_key(self.session_id)):
                view = await redis.get(reply_view_key(self.session_id))
                if view:
                    await self.send(view.decode() if isinstance(view, bytes) else str(view))
                return  # a reply is being written (on this server or another)
        except Exception as exc:
            log.warning("reply lock unavailable (Redis): %s", exc)
        if paused or self.role != "client" or not last.client_msg_id:
            return
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

    async def _take_messages(self) -> None:
        """This socket's messages, one at a time up to "stored", outside the dispatch loop.

        The turn API stores and assesses each message (a crisis is answered right there);
        what may take long, waiting for the session's writer and the reply itself, goes on
        in a task of its own, so the next message is stored at once, even mid-reply. Not in
        ``receive``: a consumer handles one event at a time, so frames broadcast to its own
        group (``chat.frame``) would wait behind the work."""
        while (item := await self.inbox.get()) is not None:
            data, retry = item
            events = self._turn_events(data, retry=retry)
            try:
                async for event in events:
                    await self._emit(event)
                    if isinstance(event, turns.Stored | turns.Held):
                        turns.keep(asyncio.create_task(self._follow(events)))
                        break
            except Exception:
                log.exception("session %s: message failed", self.session_id)
                await events.aclose()  # type: ignore[attr-defined]
                await self._send_quietly(
                    frames.error_frame(-1, "internal_error", "Something went wrong. Try again.")
                )

    def _turn_events(self, data: dict[str, Any], *, retry: bool) -> AsyncIterator[turns.TurnEvent]:
        msg_id = data.get("client_msg_id") or ""
        if self.role == "clinician":
            return turns.clinician_message(self.session_id, self.user, data.get("text", ""), msg_id)
        message = turns.ClientMessage(
            self.session_id, self.user, data.get("text", ""), msg_id, retry=retry
        )
        return turns.client_message(message)

    async def _follow(self, events: AsyncIterator[turns.TurnEvent]) -> None:
        """The rest of a message's turn: waiting for the writer, the reply, its frames."""
        try:
            async for event in events:
                await self._emit(event)
        except Exception:
            log.exception("session %s: reply failed", self.session_id)
            await self._broadcast(
                frames.clear_pending_frame()
                + frames.error_frame(-1, "internal_error", "Something went wrong. Try again.")
            )
        finally:
            # Lets go of the session's writer at once, whatever happened above.
            await events.aclose()  # type: ignore[attr-defined]

    async def _send_quietly(self, frame: str) -> None:
        """To this socket only; a page that went away does not stop the turn (its reply
        is still stored, and its other tabs still get their frames)."""
        with contextlib.suppress(Exception):
            await self.send(frame)

    async def _emit(self, event: turns.TurnEvent) -> None:
        """One turn event as frames: to this socket, or to every tab of the session."""
        if isinstance(event, turns.Rejected):
            await self._send_quietly(
                frames.error_frame(
                    -1,
                    event.code,
                    event.message,
                    retry_msg_id=event.retry_msg_id,
                    resend_text=event.resend_text,
                )
            )
        elif isinstance(event, turns.Held):
            await self._send_quietly(
                frames.error_frame(
                    -1,
                    "held",
                    "Your message is kept and will be saved as soon as storage is back.",
                    retry_msg_id=event.msg_id,
                    resend_text=event.text,
                )
            )
        elif isinstance(event, turns.Stored):
            if event.new:
                await self._broadcast(frames.turn_frame(event.turn))
        elif isinstance(event, turns.Queued):
            await self._send_quietly(frames.queued_frame(event.seq))
        elif isinstance(event, turns.Paused):
            await self._broadcast(
                frames.control_frame(event.seq, paused=True, clinician_present=True)
            )
        elif isinstance(event, turns.Writing):
            writing = frames.pending_frame(event.seq) + frames.status_frame(
                event.seq, "The counselor is writing…", busy=True
            )
            await self._broadcast(writing)
            await self._keep_writing(writing)
        elif isinstance(event, turns.Progress):
            progress = frames.progress_frame(event.seq, event.stage, event.done, event.total)
            await self._broadcast(progress)
            await self._keep_writing(frames.pending_frame(event.seq) + progress)
        elif isinstance(event, turns.Token):
            await self._broadcast(frames.token_frame(event.seq, event.index, event.text))
        elif isinstance(event, turns.Replied):
            # The frames first, the kept view after: a safe reply never waits on Redis
            # (a resync in between finds the reply stored and shows no view).
            await self._broadcast(
                frames.turn_frame(event.turn) + frames.status_frame(event.turn.seq, "")
            )
            await self._forget_writing()
        elif isinstance(event, turns.Failed):
            await self._broadcast(
                frames.clear_pending_frame()
                + frames.error_frame(
                    event.seq, event.code, event.message, retry_msg_id=event.retry_msg_id
                )
            )
            await self._forget_writing()
        elif isinstance(event, turns.Withdrawn):
            await self._broadcast(frames.clear_pending_frame() + frames.status_frame(event.seq, ""))
            await self._forget_writing()

    async def _keep_writing(self, view: str) -> None:
        """Keep ``view`` (the writing bubble and the latest status) for a tab that opens or
        reloads before the reply lands (:meth:`_show_reply_in_progress`). Kept for
        ``WRITING_VIEW_SECONDS`` at most: it is only ever shown while the session's reply
        mark says a reply is being written."""
        try:
            await redis_client().set(reply_view_key(self.session_id), view, ex=WRITING_VIEW_SECONDS)
        except Exception as exc:  # Redis away: only a reloading tab misses the bubble
            log.warning("session %s: reply view not kept: %s", self.session_id, exc)

    async def _forget_writing(self) -> None:
        try:
            await redis_client().delete(reply_view_key(self.session_id))
        except Exception as exc:  # the reply mark is gone too, so it is never shown
            log.warning("session %s: reply view not cleared: %s", self.session_id, exc)

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

    async def chat_supersede(self, event: dict[str, Any]) -> None:
        """A crisis in this session on another server: stop the replies written here."""
        before = event.get("before_seq")
        turns.supersede(self.session_id, before if isinstance(before, int) else None)

    async def chat_close(self, event: dict[str, Any]) -> None:
        """Sent by the session-end view so every open tab learns the session is over."""
        turns.supersede(self.session_id)
        await self.send(event.get("html", ""))
        await self.close(code=1000)
