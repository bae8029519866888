"""Websocket sessions benchmark: many concurrent chat sockets on the real stack vs the bare engine.

Run: ``.venv/bin/python -m bench.bench_ws [--sockets 200] [--messages 5] [--max-seconds 900]``
with DATABASE_URL / REDIS_URL set (``eval "$(.venv/bin/python scripts/datastores.py up)"``).

Web run. Daphne (a subprocess, loopback only) serves the tiny in-code model from a
dedicated database, ``psyevo_bench`` on the DATABASE_URL server (created if missing,
migrated, emptied at the start). ``--sockets`` clients are created in bulk, logged in by
writing Django sessions directly, and connected with Origin and Cookie headers; then
every socket sends ``--messages`` messages one after another, each with its own
``client_msg_id``, waiting for the reply's final counselor turn frame before the next.
Afterwards the database is the judge:
  - lost: a message whose client turn, or whose counselor turn, is not stored;
  - duplicated: more than one client turn for a client_msg_id, or more than one
    counselor turn answering one client turn.
A reply that ended in an error frame (e.g. the backend timed out under load) is counted
as failed, not lost: the client turn is stored and the page offers a retry.

Token delay. The server runs with ``WS_TIMESTAMP_FRAMES`` on, so each token frame carries
``data-t``, the wall-clock time at which the consumer turned the engine's token event
into a frame (the same event-loop step in which the engine yielded it). The client
subtracts it from the wall-clock time the frame was received (same machine, same clock).
The delay thus covers frame rendering, the Redis channel layer, the consumer and Daphne,
the socket and the client's parsing: everything between the engine and the page.

Bare run. The same number of sessions and messages through
``counselor_engine.counselor.Counselor.respond`` in this process (same tiny model, same
engine settings, built by the web app's own ``counselor_config``), all sessions
concurrent. Its token delay is the time from the creation of each token event to its
receipt by the caller (zero transport), so web/bare compares the transport against
nothing; the throughput and reply-latency ratios say what the web stack costs overall.

Both runs stop at ``--max-seconds``; what was still in flight is reported as such.
Figures go to bench/RESULTS.md (section "Websocket sessions").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
SERVER_LOG = ROOT / "bench" / "out" / "bench_ws-daphne.log"
BENCH_DB = "psyevo_bench"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/psyevo"
MESSAGES = (
    "I feel anxious about work",
    "My partner and I argued again last night",
    "I cannot sleep before exams",
    "My friend has not answered my messages",
    "I feel stuck since the move",
    "My boss criticised me in front of everyone",
    "I feel tired all the time",
)
TOKEN_T = re.compile(r'<span id="pending-text"[^>]*\bdata-t="([0-9.]+)"')
FINAL = 'class="turn turn-counselor"'
ERROR = re.compile(r'role="alert" data-code="([a-z_]+)"')


# -- setup -----------------------------------------------------------------------------------
def bench_database_url() -> str:
    base = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    return urlsplit(base)._replace(path=f"/{BENCH_DB}").geturl()


def ensure_bench_database(url: str) -> None:
    import psycopg

    admin = urlsplit(url)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if found is None:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
            print(f"created database {BENCH_DB}", flush=True)


def engine_env(args: argparse.Namespace, model_path: Path) -> dict[str, str]:
    """The engine settings both runs share (the web app reads them from the environment)."""
    return {
        "PSYEVO_BACKEND": "transformers",
        "PSYEVO_MODEL_PATH": str(model_path),
        "PSYEVO_CANDIDATES": str(args.candidates),
        "PSYEVO_MAX_NEW_TOKENS": str(args.max_new_tokens),
        "PSYEVO_MODE": args.mode,
        "PSYEVO_BACKEND_TIMEOUT": str(args.backend_timeout),
    }


@dataclass
class Account:
    index: int
    session_id: int
    cookie: str


def create_accounts(count: int) -> list[Account]:
    """``count`` consenting clients with one open session each, logged in (bulk)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord, Role, User
    from webapp.counseling import services

    call_command("flush", interactive=False, verbosity=0)  # a dedicated database
    clinician = User(username="bench-clinician", role=Role.CLINICIAN)
    clinician.set_unusable_password()
    clinician.save()
    users = []
    for i in range(count):
        user = User(username=f"bench-client-{i:04d}", role=Role.CLIENT)
        user.set_unusable_password()
        users.append(user)
    users = User.objects.bulk_create(users)
    profiles = ClientProfile.objects.bulk_create(
        [ClientProfile(user=u, modality="cbt", clinician=clinician) for u in users]
    )
    ConsentRecord.objects.bulk_create(
        [
            ConsentRecord(profile=p, purpose=c, granted=True)
            for p in profiles
            for c in ConsentPurpose
        ]
    )
    accounts = []
    for i, user in enumerate(users):
        session = services.start_session(user)
        store = SessionStore()
        store[SESSION_KEY] = str(user.pk)
        store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        store[HASH_SESSION_KEY] = user.get_session_auth_hash()
        store.save()
        cookie = f"{settings.SESSION_COOKIE_NAME}={store.session_key}"
        accounts.append(Account(i, session.pk, cookie))
    return accounts


# -- the server ------------------------------------------------------------------------------
def serve(port: int) -> None:
    """Daphne with token frames time-stamped (run as a subprocess by the web run)."""
    import django

    django.setup()
    from daphne.cli import CommandLineInterface
    from django.conf import settings

    settings.WS_TIMESTAMP_FRAMES = True  # also set in the environment, for settings.py
    CommandLineInterface().run(["-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"])


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_ws", "--serve", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5):
                break
        except urllib.error.HTTPError:
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_server(process)
                raise SystemExit(f"daphne did not start; see {log_path}") from None
            time.sleep(0.2)
    return process, port


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- measuring -------------------------------------------------------------------------------
@dataclass
class Run:
    """What one run (web or bare) measured."""

    token_delays: list[float] = field(default_factory=list)  # seconds
    reply_latencies: list[float] = field(default_factory=list)  # send -> final turn
    first_token: list[float] = field(default_factory=list)  # send -> first token
    outcomes: dict[str, str] = field(default_factory=dict)  # client_msg_id -> outcome
    started: float = 0.0
    ended: float = 0.0
    hit_cap: bool = False

    @property
    def answered(self) -> int:
        return sum(1 for o in self.outcomes.values() if o == "answered")

    @property
    def wall(self) -> float:
        return self.ended - self.started


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)  # nearest rank
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


async def web_session(
    account: Account, port: int, messages: int, run: Run, opened: asyncio.Event, go: asyncio.Event
) -> None:
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/ws/sessions/{account.session_id}/"
    try:
        ws = await connect(
            url,
            origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
            additional_headers={"Cookie": account.cookie},
            open_timeout=120,
            ping_interval=None,
            max_size=2**20,
        )
    finally:
        opened.set()  # opened or failed: the connect phase must not wait for it any longer
    async with ws:
        await go.wait()
        for k in range(messages):
            msg_id = f"b{account.index}-{k}"
            run.outcomes[msg_id] = "in flight"
            text = MESSAGES[(account.index + k) % len(MESSAGES)]
            sent = time.time()
            await ws.send(json.dumps({"type": "message", "text": text, "client_msg_id": msg_id}))
            first = True
            while True:
                frame = str(await ws.recv())
                now = time.time()
                stamps = TOKEN_T.findall(frame)
                for stamp in stamps:
                    run.token_delays.append(now - float(stamp))
                if stamps and first:
                    run.first_token.append(now - sent)
                    first = False
                if FINAL in frame:
                    run.reply_latencies.append(now - sent)
                    run.outcomes[msg_id] = "answered"
                    break
                error = ERROR.search(frame)
                if error:
                    run.outcomes[msg_id] = f"error: {error.group(1)}"
                    break


async def run_web(
    args: argparse.Namespace, accounts: list[Account], ports: list[int]
) -> tuple[Run, float]:
    # Warm-up: the server loads the model on its first message (the bare run loads it
    # before its clock starts), so one extra session answers once before measuring.
    warm, accounts = accounts[: len(ports)], accounts[len(ports) :]
    warm_run = Run()
    ready = asyncio.Event()
    ready.set()
    for account, port in zip(warm, ports, strict=True):  # each server loads its model first
        await asyncio.wait_for(web_session(account, port, 1, warm_run, asyncio.Event(), ready), 300)
    run = Run()
    go = asyncio.Event()
    opened = [asyncio.Event() for _ in accounts]
    gate = asyncio.Semaphore(args.connect_concurrency)

    async def one(account: Account, opened_one: asyncio.Event) -> None:
        async with gate:  # open sockets a few at a time, then all talk at once
            port = ports[account.index % len(ports)]  # round robin, as a proxy would
            task = asyncio.create_task(
                web_session(account, port, args.messages, run, opened_one, go)
            )
            await opened_one.wait()
        await task

    t0 = time.monotonic()
    tasks = [asyncio.create_task(one(a, e)) for a, e in zip(accounts, opened, strict=True)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), timeout=args.max_seconds)
    connect_s = time.monotonic() - t0
    run.started = time.time()
    go.set()
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, args.max_seconds - connect_s))
    run.ended = time.time()
    run.hit_cap = bool(pending)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            print(f"socket failed: {task.exception()!r}", flush=True)
    return run, connect_s


def check_database(accounts: list[Account], run: Run) -> dict[str, int]:
    """Lost and duplicated turns, judged from PostgreSQL."""
    from webapp.counseling.models import Turn

    sessions = {a.session_id: a.index for a in accounts}
    rows = Turn.objects.filter(session_id__in=sessions).order_by("session_id", "seq")
    client_turns: Counter[str] = Counter()
    replies: dict[str, int] = defaultdict(int)
    last_client: dict[int, str] = {}
    for session_id, role, msg_id in rows.values_list("session_id", "role", "client_msg_id"):
        if role == "client":
            client_turns[msg_id] += 1
            last_client[session_id] = msg_id
        elif role == "counselor" and session_id in last_client:
            replies[last_client[session_id]] += 1
    counts = Counter(run.outcomes.values())
    # A message still unanswered when the run stopped at its cap is not judged; one left
    # unanswered without the cap (its socket died) is, and counts as lost.
    judged = [m for m, o in run.outcomes.items() if not (run.hit_cap and o == "in flight")]
    expect_reply = [m for m in judged if run.outcomes[m] in ("answered", "in flight")]
    failed = {o: n for o, n in sorted(counts.items()) if o.startswith("error")}
    return {
        "sent": len(run.outcomes),
        "answered (final turn frame received)": counts["answered"],
        **{f"failed with an error frame ({o[7:]})": n for o, n in failed.items()},
        "in flight at the cap": counts["in flight"] if run.hit_cap else 0,
        "lost client turns": sum(1 for m in judged if client_turns[m] == 0),
        "lost counselor turns": sum(1 for m in expect_reply if replies[m] == 0),
        "duplicated client turns": sum(1 for m in run.outcomes if client_turns[m] > 1),
        "duplicated counselor turns": sum(1 for m in run.outcomes if replies[m] > 1),
        "unasked counselor turns": sum(1 for m in replies if m not in run.outcomes),
    }


def web(args: argparse.Namespace, model_path: Path) -> tuple[Run, dict[str, int], float]:
    url = bench_database_url()
    ensure_bench_database(url)
    env = {
        **os.environ,
        **engine_env(args, model_path),
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "webapp.settings"),
        "DEBUG": "true",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "WS_TIMESTAMP_FRAMES": "true",
        "CHANNELS_PREFIX": f"psyevo-bench-{os.getpid()}",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        "PSYEVO_MODEL_PROCESS": "false" if args.in_process_model else "true",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DEBUG")})
    import django

    django.setup()
    t0 = time.monotonic()
    accounts = create_accounts(args.sockets + args.servers)  # one warm-up per server
    print(f"{len(accounts)} accounts in {time.monotonic() - t0:.1f} s", flush=True)
    SERVER_LOG.parent.mkdir(parents=True, exist_ok=True)
    logs = [SERVER_LOG.with_name(f"bench_ws-daphne-{i}.log") for i in range(args.servers)]
    servers: list[subprocess.Popen[bytes]] = []
    try:
        ports = []
        for log_path in logs:
            server, port = start_server(env, log_path)
            servers.append(server)
            ports.append(port)
        run, connect_s = asyncio.run(run_web(args, accounts, ports))
        accounts = accounts[args.servers :]  # the warm-up sessions are not judged
    finally:
        for server in servers:
            stop_server(server)
    for log_path in logs:
        lines = log_path.read_text(errors="replace").splitlines()
        problems = [ln for ln in lines if " ERROR " in ln]
        print(f"server log {log_path}: {len(problems)} ERROR lines", *problems[:5], sep="\n")
    return run, check_database(accounts, run), connect_s


# -- the bare engine -------------------------------------------------------------------------
async def run_bare(args: argparse.Namespace, model_path: Path) -> Run:
    from dataclasses import dataclass as _dataclass

    from counselor_engine import counselor as engine
    from counselor_engine.backends import make_backend
    from counselor_engine.counselor import (
        ClientState,
        Counselor,
        DoneEvent,
        ErrorEvent,
    )
    from counselor_engine.seeds import stable_seed
    from webapp.counseling.runtime import counselor_config, prior_table

    @_dataclass(frozen=True)
    class TimedTokenEvent(engine.TokenEvent):
        born: float = field(default_factory=time.perf_counter)

    engine.TokenEvent = TimedTokenEvent  # type: ignore[misc]  # respond() builds these now
    backend = make_backend("transformers", model_path=str(model_path))
    run = Run()

    async def session(index: int) -> None:
        config = counselor_config(mode=args.mode, seed=stable_seed(index, "bench"))
        counselor = Counselor(backend, prior=prior_table(), config=config)
        counselor.start_session(ClientState(str(index), "cbt", 0, 8), None)
        for k in range(args.messages):
            msg_id = f"b{index}-{k}"
            run.outcomes[msg_id] = "in flight"
            sent = time.perf_counter()
            first = True
            async for event in counselor.respond(MESSAGES[(index + k) % len(MESSAGES)]):
                now = time.perf_counter()
                if isinstance(event, TimedTokenEvent):
                    run.token_delays.append(now - event.born)
                    if first:
                        run.first_token.append(now - sent)
                        first = False
                elif isinstance(event, DoneEvent):
                    run.reply_latencies.append(now - sent)
                    run.outcomes[msg_id] = "answered"
                elif isinstance(event, ErrorEvent):
                    run.outcomes[msg_id] = f"error: {event.code}"

    run.started = time.time()
    tasks = [asyncio.create_task(session(i)) for i in range(args.sockets)]
    _, pending = await asyncio.wait(tasks, timeout=args.max_seconds)
    run.ended = time.time()
    run.hit_cap = bool(pending)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return run


# -- report ----------------------------------------------------------------------------------
def ms(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value * 1e6:.0f} µs" if value < 0.001 else f"{value * 1000:.1f} ms"


def ratio(a: float, b: float) -> str:
    return "n/a" if not b or a != a or b != b else f"{a / b:.1f}x"


def capacity(args: argparse.Namespace, run: Run) -> str:
    """Capacity figures: what this many servers sustained, per server and per core."""
    cores = os.cpu_count() or 1
    turns = run.answered / run.wall if run.wall > 0 else float("nan")
    return (
        f"Capacity: {args.sockets} concurrent sessions on {args.servers} ASGI process(es) "
        f"({args.sockets / args.servers:.0f} per process) sustained {turns:.2f} answered "
        f"turns/s in all, {turns / args.servers:.2f} per process and {turns / cores:.2f} per "
        f"core, with reply latency p95 {pct(run.reply_latencies, 95):.1f} s (the tiny model; "
        "the model, not the web stack, bounds it: see the bare engine column)."
    )


def report(
    args: argparse.Namespace,
    web_run: Run,
    checks: dict[str, int],
    connect_s: float,
    bare: Run | None,
) -> str:
    def row(name: str, w: float, b: float | None, fmt=ms) -> str:  # type: ignore[no-untyped-def]
        bare_cell = "—" if b is None else fmt(b)
        return f"| {name} | {fmt(w)} | {bare_cell} | {'—' if b is None else ratio(w, b)} |"

    def tput(r: Run) -> float:
        return r.answered / r.wall if r.wall > 0 else float("nan")

    def per_s(v: float) -> str:
        return "n/a" if v != v else f"{v:.2f} turns/s"

    def secs(v: float) -> str:
        return f"{v:.1f} s"

    b = bare
    target = pct(web_run.token_delays, 95)
    lines = [
        f"{args.sockets} concurrent sockets x {args.messages} messages, tiny in-code model, "
        f"mode `{args.mode}`, N = {args.candidates} candidates, {args.max_new_tokens} new tokens, "
        f"backend timeout {args.backend_timeout:.0f} s, cap {args.max_seconds:.0f} s. "
        f"Loopback only; {args.servers} Daphne process(es), the model "
        f"{'inside each' if args.in_process_model else 'in a child process of each (nice 10)'}; "
        f"{os.cpu_count()} cores shared by servers, clients and models. Load average at the end: "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + ".",
        "",
        "| measure | web (Daphne, Redis, websockets) | bare engine | web / bare |",
        "| --- | --- | --- | --- |",
        row("wall time (all messages)", web_run.wall, b.wall if b else None, secs),
        row("throughput", tput(web_run), tput(b) if b else None, per_s),
        row("reply latency p50 (send -> final turn)", pct(web_run.reply_latencies, 50),
            pct(b.reply_latencies, 50) if b else None),
        row("reply latency p95", pct(web_run.reply_latencies, 95),
            pct(b.reply_latencies, 95) if b else None),
        row("first token p95 (send -> first token)", pct(web_run.first_token, 95),
            pct(b.first_token, 95) if b else None),
        row("token delay p50 (engine token -> frame received)", pct(web_run.token_delays, 50),
            pct(b.token_delays, 50) if b else None),
        row("**token delay p95** (target < 50 ms)", target,
            pct(b.token_delays, 95) if b else None),
        row("token delay max", max(web_run.token_delays, default=float("nan")),
            max(b.token_delays, default=float("nan")) if b else None),
        "",
        f"Sockets connected in {connect_s:.1f} s; {len(web_run.token_delays)} token frames "
        f"timed{'' if b is None else f' (bare: {len(b.token_delays)} token events)'}."
        + (" **The web run hit the cap.**" if web_run.hit_cap else "")
        + (" **The bare run hit the cap.**" if b is not None and b.hit_cap else ""),
        "",
        capacity(args, web_run),
        "",
        "Database check (web run):",
        "",
        "| count | value |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in checks.items()],
        "",
        f"**lost = {checks['lost client turns'] + checks['lost counselor turns']}, "
        f"duplicated = {checks['duplicated client turns'] + checks['duplicated counselor turns']}** "
        f"(both must be 0); token delay p95 {ms(target)} "
        f"({'meets' if target < 0.05 else 'misses'} the 50 ms target).",
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--max-seconds", type=float, default=900.0, help="hard cap for each run")
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--mode", choices=("graph", "stream_first"), default="graph")
    parser.add_argument("--backend-timeout", type=float, default=120.0)
    parser.add_argument("--connect-concurrency", type=int, default=20)
    parser.add_argument("--servers", type=int, default=1, help="Daphne processes (round robin)")
    parser.add_argument(
        "--in-process-model",
        action="store_true",
        help="run the model inside each Daphne process (default: in its own child process)",
    )
    parser.add_argument("--section", default="Websocket sessions", help="RESULTS.md section")
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    try:
        import websockets  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench_ws needs the 'websockets' package (pip install websockets)"
        ) from None
    if not 1 <= args.sockets <= 1000 or not 1 <= args.messages <= 50:
        raise SystemExit("--sockets must be 1..1000 and --messages 1..50")
    if not 1 <= args.servers <= 8:
        raise SystemExit("--servers must be 1..8")

    with tempfile.TemporaryDirectory(prefix="bench-ws-") as tmp:
        from counselor_engine.backends.tiny import build_tiny_model

        workdir = Path(tmp)
        model_path = build_tiny_model(workdir / "tiny", seed=0)
        os.environ.update(engine_env(args, model_path))  # the bare run reads the same settings
        web_run, checks, connect_s = web(args, model_path)
        print(f"web run: {web_run.answered} answered in {web_run.wall:.1f} s", flush=True)
        bare = None if args.skip_bare else asyncio.run(run_bare(args, model_path))
        if bare is not None:
            print(f"bare run: {bare.answered} answered in {bare.wall:.1f} s", flush=True)
        body = report(args, web_run, checks, connect_s, bare)
    print(body)
    if not args.no_write:
        from bench._results import write_section

        write_section(args.section, body)


if __name__ == "__main__":
    main()
