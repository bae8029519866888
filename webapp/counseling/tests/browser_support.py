"""Live-server helpers for browser tests: Daphne in a subprocess, the system Chromium.

The server is a real ``daphne`` process on a free loopback port, pointed at the
pytest-django test database (so the test must use ``django_db(transaction=True)``: the
server sees only committed rows) and at the same Redis as the tests. Chromium is
Debian's ``/usr/bin/chromium`` driven by Playwright; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from django.conf import settings
from django.db import connections

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(db: Mapping[str, Any]) -> str:
    """A DATABASE_URL for ``settings.DATABASES[alias]`` (read after the test database exists,
    so NAME is the test database's). A unix-socket host, whether in HOST or in
    OPTIONS["host"], goes into the query string, where libpq and django-environ read it."""
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    host = str(db.get("HOST") or "")
    port = str(db.get("PORT") or "")
    options = {
        k: str(v)
        for k, v in (db.get("OPTIONS") or {}).items()
        if isinstance(v, str | int | float) and not isinstance(v, bool)
    }
    if host.startswith("/"):
        options.setdefault("host", host)
        host = ""
    auth = f"{user}:{password}@" if user or password else ""
    netloc = f"{auth}{host}" + (f":{port}" if port else "")
    query = f"?{urlencode(options)}" if options else ""
    return f"postgresql://{netloc}/{quote(str(db['NAME']), safe='')}{query}"


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def start(self) -> None:
        """Start (again, on the same port) and wait until it answers HTTP."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(f"{self.url}/login/"):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daphne exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"daphne did not answer in {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def crash(self) -> None:
        """SIGKILL, as a crashed or power-cut server: sockets drop without a close frame."""
        self.process.kill()
        self.process.wait(timeout=10)


def _answers(url: str) -> bool:
    """Any HTTP answer counts (the login page; /healthz waits on its checks and is 503
    without a Celery worker)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def stop_process(process: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps the child."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def run_daphne(env: Mapping[str, str], log_path: Path) -> Iterator[LiveServer]:
    """Start ``daphne webapp.asgi:application`` on a free loopback port with ``env`` on top
    of this process's environment; wait until it answers HTTP; stop it on exit."""
    port = free_port()
    full_env = {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        **os.environ,  # the tests' settings module, when one is set
        "PYTHONUNBUFFERED": "1",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        # Our own channel-layer namespace: other processes on this Redis never see our groups.
        "CHANNELS_PREFIX": f"psyevo-live-{port}",
        **env,
    }
    command = [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
        "webapp.asgi:application",
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    server = LiveServer(
        f"http://127.0.0.1:{port}",
        None,
        log_path,
        command,
        full_env,  # type: ignore[arg-type]
    )
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            stop_process(server.process)
        wait_for_other_db_sessions_to_end()


def wait_for_other_db_sessions_to_end(timeout: float = 10.0) -> None:
    """PostgreSQL ends a dead client's backend a moment after the client is gone; wait for
    that, or dropping the test database at the end of the run fails ("being accessed by
    other users")."""
    from django.db import connection

    sql = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(sql)
            if cursor.fetchone()[0] == 0 or time.monotonic() > deadline:
                return
            time.sleep(0.1)


def server_env(model_path: str, *, max_new_tokens: int = 24, candidates: int = 2) -> dict[str, str]:
    """Environment for a live server on the current test database and Redis."""
    return {
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "REDIS_URL": settings.REDIS_URL,
        "DEBUG": "true",
        "PSYEVO_BACKEND": "transformers",
        "PSYEVO_MODEL_PATH": model_path,
        "PSYEVO_CANDIDATES": str(candidates),
        "PSYEVO_MAX_NEW_TOKENS": str(max_new_tokens),
        "LOG_LEVEL": "WARNING",
    }


def orm(work: Callable[[], T]) -> T:
    """Run ORM work from inside a Playwright block.

    Playwright's sync API leaves its event loop registered as running on this thread, so
    Django refuses ORM calls here (SynchronousOnlyOperation) and, with the refusal
    overridden, would open a second connection that nothing closes (and the test database
    could not be dropped). A short-lived thread, as Django advises, whose connection is
    closed when the work is done."""

    def run() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


@contextlib.contextmanager
def chromium(playwright: Any) -> Iterator[Any]:
    """A headless system Chromium with a fresh profile (a persistent browser context)."""
    with tempfile.TemporaryDirectory(prefix="psyevo-chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context
        finally:
            context.close()
