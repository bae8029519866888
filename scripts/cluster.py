"""Start several ASGI servers and Celery workers on one machine, and stop them all.

A process launcher for multi-process tests, benchmarks and soak runs. The command lines
are the ``Procfile``'s own (``web``, ``worker``, ``training``), read from it at start,
so what runs here is what runs in production; only the port, the worker's node name and
the interpreter (this one's ``-m daphne`` / ``-m celery``) are filled in.

Python API::

    from scripts.cluster import Cluster

    env = {"DATABASE_URL": ..., "REDIS_URL": ..., "PSYEVO_MODEL_PATH": tiny_model_dir}
    with Cluster(asgi=2, workers=("default", "training"), env=env, log_dir=tmp) as c:
        c.urls            # ["http://127.0.0.1:PORT_A", "http://127.0.0.1:PORT_B"]
        c.ws_urls         # the same with ws://
        c.kill_asgi(0)    # SIGKILL server 0 (a crash); c.start_asgi(0) brings it back
        c.kill_worker("training"); c.start_worker("training")
        c.rss()           # {"asgi-0": bytes, ..., "worker-default": bytes} (whole groups)

``Cluster(..., beat=True)`` adds the Procfile's ``beat``; ``purge=True`` empties the
workers' queues on the broker before and after (tests on a shared Redis database).

Start-up waits until every ASGI server answers ``GET /healthz`` with 200 (database,
Redis and a Celery worker reachable) and every worker answers ``celery inspect ping``.

Environment: each process gets this process's environment, then the cluster's defaults
(``ALLOWED_HOSTS`` for loopback, and one ``CHANNELS_PREFIX`` shared by all its processes,
so servers see each other's groups and no other process on the same Redis sees them),
then ``env``, which may override them. For the tiny test model pass ``PSYEVO_MODEL_PATH`` (the root
conftest's ``tiny_model_dir``); in tests, build ``env`` with
``webapp.counseling.tests.browser_support.server_env`` so every process uses the test
database.

Teardown is reliable: every process starts in its own process group (``killpg`` reaches
a Celery worker's pool children too), gets SIGTERM then SIGKILL after a grace period,
and is reaped; on Linux each one also gets SIGKILL if the launching process dies without
cleaning up (``PR_SET_PDEATHSIG``, set only for processes started from the main thread:
the signal follows the thread that started the child), so a failed or killed test leaves
no orphan.

Command line (for trying things by hand; Ctrl-C stops everything)::

    .venv/bin/python scripts/cluster.py --asgi 2 --workers default,training
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = ROOT / "Procfile"
WORKER_ROLES = {"default": "worker", "training": "training"}  # queue -> Procfile entry
PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A process did not start, or did not become healthy in time (log tail included)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def procfile_commands(path: Path = PROCFILE) -> dict[str, str]:
    """``{name: command}`` from a Procfile (``name: command`` lines)."""
    commands: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.startswith("#"):
            commands[name.strip()] = command.strip()
    return commands


def expand(command: str, values: Mapping[str, str]) -> list[str]:
    """Expand ``${NAME:-default}`` / ``$NAME`` from ``values`` and split like a shell."""

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1) or match.group(3), match.group(2) or ""
        return values.get(name) or default

    text = re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", sub, command)
    argv = shlex.split(text)
    if argv and argv[0] in ("daphne", "celery"):
        argv = [sys.executable, "-m", argv[0], *argv[1:]]  # this interpreter's package
    return argv


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the context manager's teardown still stops everything


@dataclass
class Proc:
    """One launched process (and its process group)."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    port: int | None = None
    node: str | None = None
    held_down: bool = False  # stopped or killed on purpose: a supervisor leaves it down
    restarts: int = 0  # times a supervisor restarted it after it exited on its own

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, env: Mapping[str, str]) -> None:
        self.held_down = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(
                f"\n=== start {time.strftime('%H:%M:%S')}: {shlex.join(self.argv)}\n".encode()
            )
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches its children
                # PDEATHSIG follows the *thread* that forked: only from the main thread.
                preexec_fn=_die_with_parent
                if threading.current_thread() is threading.main_thread()
                else None,
            )

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace``; always reaps."""
        self.held_down = True
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        self.signal_group(signal.SIGKILL)  # pool children that outlived their parent too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """A crash: ``sig`` to the group, then reap (no grace, no clean shutdown)."""
        self.held_down = True  # a fault the caller injects; the caller restarts it
        if self.popen is None:
            return
        self.signal_group(sig)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def group_rss(pid: int) -> int:
    """Resident memory (bytes) of every process in ``pid``'s process group (from /proc)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pid:  # field 5 (pgrp), counted after the ")"
                total += int((entry / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class Cluster:
    """``asgi`` daphne servers and one Celery worker per name in ``workers``.

    ``workers`` names queues: ``default`` runs the Procfile's ``worker`` line, ``training``
    its ``training`` line (``-I training_worker.tasks``, concurrency 1). ``beat`` adds the
    Procfile's ``beat`` (periodic upkeep; its schedule file goes to ``log_dir``). ``ports`` fixes the
    servers' ports (default: free loopback ports). ``purge`` empties the workers' queues
    on the broker first (for tests on a shared Redis: a stale message from another run
    must not be taken for this one's). ``wait_healthy`` waits for /healthz 200 and the
    workers' pings at start. ``supervise`` restarts a process that exits on its own (not
    one stopped or killed through this object), as systemd's ``Restart=always`` would in
    production (docs/deploy.md): a Celery worker can exit on a broker restart.
    """

    asgi: int = 1
    workers: Sequence[str] = ("default", "training")
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path = ROOT / "var" / "cluster"
    ports: Sequence[int] | None = None
    start_timeout: float = 180.0
    purge: bool = False
    wait_healthy: bool = True
    beat: bool = False
    grace: float = 10.0
    supervise: bool = False
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    procs: dict[str, Proc] = field(init=False, default_factory=dict)
    _watch_stop: threading.Event = field(init=False, default_factory=threading.Event)
    _watcher: threading.Thread | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        unknown = [w for w in self.workers if w not in WORKER_ROLES]
        if unknown:
            raise ValueError(f"unknown worker queue(s) {unknown}; known: {sorted(WORKER_ROLES)}")
        if self.asgi < 0:
            raise ValueError("asgi must be >= 0")
        if self.ports is not None and len(self.ports) != self.asgi:
            raise ValueError(f"{len(self.ports)} ports for {self.asgi} ASGI servers")
        commands = procfile_commands()
        ports = (
            list(self.ports) if self.ports is not None else [free_port() for _ in range(self.asgi)]
        )
        self.log_dir = Path(self.log_dir)
        for i, port in enumerate(ports):
            argv = expand(commands["web"], {"WEB_HOST": "127.0.0.1", "WEB_PORT": str(port)})
            self.procs[f"asgi-{i}"] = Proc(
                f"asgi-{i}", argv, self.log_dir / f"asgi-{i}.log", port=port
            )
        for queue in self.workers:
            node = f"{queue}-{self.tag}@{socket.gethostname()}"
            argv = expand(commands[WORKER_ROLES[queue]], {})
            argv = [node if a == f"{queue}@%h" else a for a in argv]  # unique node name
            self.procs[f"worker-{queue}"] = Proc(
                f"worker-{queue}", argv, self.log_dir / f"worker-{queue}.log", node=node
            )

        if self.beat:
            argv = expand(commands["beat"], {"PSYEVO_DATA_DIR": str(self.log_dir)})
            self.procs["beat"] = Proc("beat", argv, self.log_dir / "beat.log")

    # -- environment ----------------------------------------------------------------------
    @property
    def full_env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "webapp.settings"),
            "PYTHONUNBUFFERED": "1",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            **self.env,
        }
        env.setdefault("CHANNELS_PREFIX", f"psyevo-cluster-{self.tag}")
        env.pop("PYTEST_CURRENT_TEST", None)
        return env

    @property
    def broker_url(self) -> str:
        env = self.full_env
        return env.get("CELERY_BROKER_URL") or env.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

    # -- addresses --------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.procs[f'asgi-{i}'].port}" for i in range(self.asgi)]

    @property
    def ws_urls(self) -> list[str]:
        return [u.replace("http://", "ws://", 1) for u in self.urls]

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.purge:
            self.purge_queues()
        for name in self.procs:
            self.procs[name].start(self.full_env)
        if self.wait_healthy:
            self.wait_until_healthy()
        if self.supervise:
            self._watch_stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="cluster-supervisor",
                                             daemon=True)  # fmt: skip
            self._watcher.start()

    def _watch(self) -> None:
        """Restart processes that exited on their own, at most once a second each."""
        env = self.full_env
        while not self._watch_stop.wait(1.0):
            for proc in list(self.procs.values()):
                if proc.popen is not None and not proc.alive and not proc.held_down:
                    code = proc.popen.returncode
                    print(f"cluster: {proc.name} exited ({code}); restarting", file=sys.stderr)
                    proc.restarts += 1
                    proc.start(env)

    @property
    def restarts(self) -> dict[str, int]:
        """Supervisor restarts per process (only those restarted at least once)."""
        return {name: p.restarts for name, p in self.procs.items() if p.restarts}

    def stop(self) -> None:
        """Stop every process (never raises; safe to call twice)."""
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        for proc in reversed(list(self.procs.values())):
            try:
                proc.stop(grace=self.grace)
            except Exception as exc:  # keep stopping the others
                print(f"cluster: stopping {proc.name} failed: {exc!r}", file=sys.stderr)
        if self.purge:
            try:
                self.purge_queues()
            except Exception as exc:
                print(f"cluster: purge at exit failed: {exc!r}", file=sys.stderr)

    def wait_until_healthy(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        for i in range(self.asgi):
            self.wait_asgi(i, deadline=deadline)
        self.wait_workers([q for q in self.workers], deadline=deadline)

    # -- single processes (fault injection) ---------------------------------------------------
    def asgi_proc(self, index: int) -> Proc:
        return self.procs[f"asgi-{index}"]

    def worker_proc(self, queue: str) -> Proc:
        return self.procs[f"worker-{queue}"]

    def kill_asgi(self, index: int, sig: int = signal.SIGKILL) -> None:
        self.asgi_proc(index).kill(sig)

    def start_asgi(self, index: int, *, wait: bool = True) -> None:
        proc = self.asgi_proc(index)
        if proc.alive:
            raise ClusterError(f"{proc.name} is already running")
        proc.start(self.full_env)
        if wait:
            self.wait_asgi(index, deadline=time.monotonic() + self.start_timeout, healthz=False)

    def kill_worker(self, queue: str, sig: int = signal.SIGKILL) -> None:
        self.worker_proc(queue).kill(sig)

    def start_worker(self, queue: str, *, wait: bool = True) -> None:
        proc = self.worker_proc(queue)
        if proc.alive:
            raise ClusterError(f"{proc.name} is already running")
        proc.start(self.full_env)
        if wait:
            self.wait_workers([queue], deadline=time.monotonic() + self.start_timeout)

    def rss(self) -> dict[str, int]:
        """Resident bytes per process group (a worker counts with its pool children)."""
        return {n: group_rss(p.popen.pid) for n, p in self.procs.items() if p.alive and p.popen}

    # -- waiting ------------------------------------------------------------------------------
    def _check_alive(self, proc: Proc) -> None:
        if not proc.alive:
            code = proc.popen.returncode if proc.popen else None
            raise ClusterError(f"{proc.name} exited ({code}):\n{proc.log_tail()}")

    def wait_asgi(self, index: int, *, deadline: float, healthz: bool = True) -> None:
        """Until ``/healthz`` answers 200 (``healthz=False``: any HTTP answer at all)."""
        proc = self.asgi_proc(index)
        url = f"{self.urls[index]}/healthz"
        last = "no answer"
        while True:
            self._check_alive(proc)
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if not healthz:
                    return
                last = f"{exc.code}: {exc.read()[:300]!r}"
            except OSError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise ClusterError(f"{proc.name} not healthy ({last}):\n{proc.log_tail()}")
            time.sleep(0.3)

    def ping_workers(self, queues: Iterable[str], timeout: float = 3.0) -> set[str]:
        """Node names that answer ``celery inspect ping`` (the documented health check)."""
        nodes = [self.worker_proc(q).node or "" for q in queues]
        argv = [sys.executable, "-m", "celery", "-A", "webapp", "inspect", "ping",
                "--timeout", str(timeout), "--json", "-d", ",".join(nodes)]  # fmt: skip
        done = subprocess.run(
            argv, cwd=ROOT, env=self.full_env, capture_output=True, text=True, timeout=120
        )
        answered: set[str] = set()
        for line in done.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    answered |= set(json.loads(line))
                except ValueError:
                    continue
        return answered & set(nodes)

    def wait_workers(self, queues: Sequence[str], *, deadline: float) -> None:
        pending = list(queues)
        while pending:
            for queue in pending:
                self._check_alive(self.worker_proc(queue))
            answered = self.ping_workers(pending)
            pending = [q for q in pending if self.worker_proc(q).node not in answered]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(self.worker_proc(q).log_tail() for q in pending)
                raise ClusterError(f"workers {pending} did not answer a ping:\n{tails}")
            time.sleep(0.5)

    def purge_queues(self) -> None:
        """Drop waiting messages of this cluster's queues from the broker (Redis lists)."""
        import redis

        client = redis.Redis.from_url(self.broker_url, socket_connect_timeout=5)
        try:
            client.delete(*self.workers) if self.workers else None
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asgi", type=int, default=2)
    parser.add_argument("--workers", default="default,training")
    parser.add_argument("--ports", default="", help="comma-separated ports for the servers")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "var" / "cluster")
    args = parser.parse_args(argv)
    workers = tuple(w for w in args.workers.split(",") if w)
    ports = [int(p) for p in args.ports.split(",") if p] or None
    with Cluster(asgi=args.asgi, workers=workers, ports=ports, log_dir=args.log_dir) as cluster:
        print(json.dumps({"urls": cluster.urls, "logs": str(args.log_dir)}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
