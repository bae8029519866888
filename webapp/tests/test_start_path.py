"""The newcomer's first command: ``bin/up`` from a clean shell, the way a person runs it.

``bin/up`` runs as a subprocess with nothing but HOME and the system PATH
(/usr/local/bin:/usr/bin:/bin): no activated venv, no DATABASE_URL or REDIS_URL, so it
starts its own embedded PostgreSQL and Redis in a private ``PSYEVO_DATA_DIR``. The tiny
in-code model stands in for SmolLM2 through ``PSYEVO_MODEL_PATH`` (configuration, as a
clinic would point it at its own model folder). Then, as a newcomer would:

1. read the demo accounts ``bin/up`` printed, wait for ``/healthz`` (database, Redis and
   both Celery workers up);
2. log in as a demo client, who is taken to "My choices" with the reason, agree to
   counseling, start a session and get a counselor reply over the real websocket;
3. press Ctrl-C (SIGTERM to ``bin/up``): every process it started is gone, and the embedded
   services stop with ``scripts/datastores.py down``.

The ``bin/up`` of before this test (a Procfile naming bare ``daphne`` and ``celery``, found
only on an activated venv's PATH) fails step 1: every process dies with "not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet
from playwright.sync_api import expect, sync_playwright
from websockets.asyncio.client import connect

from webapp.counseling.tests.browser_support import CHROMIUM, chromium, free_port
from webapp.tests.live_http import Web
from webapp.tests.vllm_stub import group_members, make_stub_venv, stub_model

ROOT = Path(__file__).resolve().parents[2]
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
START_S = 420.0  # a bound against hangs (migrations on two busy cores), never asserted on
DEMO_LINE = re.compile(r"^\s+(admin|clinician|client) (\S+) (\S+)$", re.M)

pytestmark = pytest.mark.timeout(600)


@dataclass
class Up:
    """A running ``bin/up``: its process (honcho, once it has exec'ed), output and data."""

    process: subprocess.Popen[bytes]
    log: Path
    data_dir: Path
    url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"bin/up exited ({self.process.returncode}) before {what}:\n"
                    + self.output()[-6000:]
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} in {timeout:.0f} s:\n" + self.output()[-6000:])
            time.sleep(0.5)


def clean_env(data_dir: Path, port: int, model_dir: Path) -> dict[str, str]:
    """What a newcomer's fresh login shell has, plus the three settings this test chooses."""
    return {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": CLEAN_PATH,
        "LANG": "C.UTF-8",
        "PSYEVO_DATA_DIR": str(data_dir),
        "WEB_PORT": str(port),
        "PSYEVO_MODEL_PATH": str(model_dir),
        "PSYEVO_CANDIDATES": "2",
        "PSYEVO_MAX_NEW_TOKENS": "8",
    }


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (read from /proc; no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended; only unreaped


def healthz(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}healthz", timeout=5) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def embedded_pids(data_dir: Path) -> list[int]:
    pids = [int((data_dir / "pg" / "postmaster.pid").read_text().splitlines()[0])]
    pids.append(int((data_dir / "redis" / "redis.pid").read_text()))
    return pids


def services(data_dir: Path, action: str) -> subprocess.CompletedProcess[str]:
    """``scripts/datastores.py up|down`` for this data folder (``up`` finds what runs)."""
    return subprocess.run(
        [str(ROOT / ".venv/bin/python"), "scripts/datastores.py", action],
        cwd=ROOT,
        env={"PATH": CLEAN_PATH, "PSYEVO_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def launch(tmp_path: Path, tiny_model_dir: Path) -> Iterator[Callable[..., Up]]:
    """Start ``bin/up`` from a clean shell (plus ``extra`` settings); ended on teardown
    however the test went, with its embedded services."""
    started: list[Up] = []

    def start(**extra: str) -> Up:
        data_dir = tmp_path / "data"
        port = free_port()
        log = tmp_path / "bin-up.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ["bash", "bin/up"],
                cwd=ROOT,
                env={**clean_env(data_dir, port, tiny_model_dir), **extra},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so a failed test can still end the whole tree
            )
        started.append(Up(process, log, data_dir, f"http://127.0.0.1:{port}/"))
        return started[-1]

    try:
        yield start
    finally:
        for running in started:
            process = running.process
            if process.poll() is None:
                for pid in descendants(process.pid):
                    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                        os.kill(pid, signal.SIGKILL)
                process.kill()
                process.wait(timeout=30)
            services(running.data_dir, "down")


@pytest.fixture
def up(launch: Callable[..., Up]) -> Up:
    return launch()


async def one_turn(base_ws: str, session_id: int, web: Web) -> str:
    """Send one message as the chat page does; return the counselor's turn frame."""
    async with connect(
        f"{base_ws}/ws/sessions/{session_id}/",
        origin=base_ws.replace("ws://", "http://"),  # type: ignore[arg-type]
        additional_headers={"Cookie": web.header},
        open_timeout=60,
    ) as ws:
        await ws.send(json.dumps({"type": "resync", "after_seq": -1}))
        await ws.send(
            json.dumps(
                {"type": "message", "text": "I feel tense before work", "client_msg_id": "m1"}
            )
        )
        async with asyncio.timeout(240):
            while True:
                frame = str(await ws.recv())
                if 'class="turn turn-counselor"' in frame:
                    return frame
                assert 'class="error"' not in frame, frame


def test_bin_up_starts_serves_a_turn_and_stops_from_a_clean_shell(up: Up) -> None:
    # 1. Up: demo accounts printed once, every process from the project's environment.
    up.wait_for("healthy /healthz", lambda: healthz(up.url) is not None)
    report = healthz(up.url)
    assert report is not None and report["status"] == "ok", report
    up.wait_for(
        "both Celery workers ready",
        lambda: (
            "default@" in up.output()
            and "training@" in up.output()
            and up.output().count(" ready.") >= 2
        ),
    )
    output = up.output()
    assert "not found" not in output, output[-4000:]
    accounts = {name: (role, password) for role, name, password in DEMO_LINE.findall(output)}
    clients = [name for name, (role, _) in accounts.items() if role == "client"]
    assert len(accounts) == 7 and clients, output[:3000]

    # 2. A demo client logs in, is asked for consent first, then talks with the counselor.
    web = Web()
    base = up.url.rstrip("/")
    landed = web.log_in(base, clients[0], accounts[clients[0]][1])
    page = web.get(landed)[1]
    assert "/me/consent/" in landed and "please agree to counseling" in page, landed
    after, _ = web.post(landed, {"counseling": "on"})
    assert after.rstrip("/").endswith("/sessions"), after
    chat_url, chat_page = web.post(f"{base}/sessions/start/", {})
    session_id = int(re.search(r"/sessions/(\d+)/", chat_url).group(1))  # type: ignore[union-attr]
    assert "You are talking with an AI counselor" in chat_page
    frame = asyncio.run(one_turn(base.replace("http://", "ws://"), session_id, web))
    assert 'data-seq="1"' in frame

    # 3. Ctrl-C: every process bin/up started ends; the embedded services stop on request.
    started = descendants(up.process.pid)
    assert len(started) >= 8, started  # web, its model child, 2 workers + pools, beat
    up.process.send_signal(signal.SIGTERM)
    up.process.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = sorted(pid for pid in started if alive(pid))
    assert not left, f"left behind: {left}\n" + up.output()[-3000:]
    embedded = embedded_pids(up.data_dir)
    assert all(alive(pid) for pid in embedded)  # services outlive Ctrl-C, by design
    down = services(up.data_dir, "down")
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in embedded), down.stderr


def test_in_production_bin_up_creates_no_account_and_prints_no_password(
    launch: Callable[..., Up],
) -> None:
    up = launch(
        DEBUG="false",
        SECRET_KEY=Fernet.generate_key().decode() * 2,
        ALLOWED_HOSTS="127.0.0.1",
        PSYEVO_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
    )
    up.wait_for("healthy /healthz", lambda: healthz(up.url) is not None)
    output = up.output()
    assert "Demo accounts" not in output and not DEMO_LINE.search(output), output[:3000]
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in services(up.data_dir, "up").stdout.splitlines()
    )
    with psycopg.connect(shlex.split(exports["DATABASE_URL"])[0]) as conn:
        assert conn.execute("SELECT count(*) FROM accounts_user").fetchone() == (0,)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(
        item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
    )


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def test_with_vllm_and_no_url_bin_up_runs_bin_vllm_and_hands_its_url_on(
    launch: Callable[..., Up], tmp_path: Path
) -> None:
    """``PSYEVO_BACKEND=vllm`` without ``PSYEVO_VLLM_URL``: bin/up writes a Procfile with a
    ``vllm: bin/vllm`` process (here over a stand-in .venv-vllm, webapp/tests/vllm_stub.py),
    gives the web and every worker the URL of that server, and Ctrl-C leaves nothing of
    it behind: not the supervisor, not the server, not the server's engine child (which
    ignores SIGTERM, as only a stop of the whole group ends it)."""
    vllm_port, record = free_port(), tmp_path / "vllm-server.json"
    vllm_url = f"http://127.0.0.1:{vllm_port}"
    up = launch(
        PSYEVO_BACKEND="vllm",
        PSYEVO_VLLM_VENV=str(make_stub_venv(tmp_path / "venv-vllm")),
        PSYEVO_VLLM_MODEL_PATH=str(stub_model(tmp_path / "vllm-model")),
        VLLM_PORT=str(vllm_port),
        STAND_IN_RECORD=str(record),
    )
    try:
        up.wait_for("the vLLM server's /health", lambda: _answers(f"{vllm_url}/health"))
        server = json.loads(record.read_text())
        procfile = (up.data_dir / "Procfile.vllm").read_text().splitlines()
        plain = (ROOT / "Procfile").read_text().splitlines()
        assert procfile == [*plain, "vllm: bin/vllm"], procfile
        assert "installing vLLM" not in up.output()  # the stamp matched

        def processes() -> dict[str, int]:
            found: dict[str, int] = {}
            for pid in descendants(up.process.pid):
                line = cmdline(pid)
                for name, marker in (("web", "daphne"), ("worker", "-n default@"),
                                     ("training", "-n training@"), ("beat", " beat "),
                                     ("vllm", "vllm_supervisor.py")):  # fmt: skip
                    if marker in line and "sh -c" not in line:
                        found.setdefault(name, pid)
            return found

        up.wait_for("all five processes", lambda: len(processes()) == 5)
        for name, pid in processes().items():
            if name == "vllm":
                continue
            env = environ(pid)
            assert env.get("PSYEVO_VLLM_URL") == vllm_url, (name, env.get("PSYEVO_VLLM_URL"))
            assert env.get("PSYEVO_BACKEND") == "vllm", name

        # Ctrl-C: bin/up (honcho) stops every process; bin/vllm's whole server group goes.
        started = descendants(up.process.pid) | group_members(server["server"])
        assert {server["server"], server["engine"]} <= started
        up.process.send_signal(signal.SIGTERM)
        up.process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: cmdline(pid) for pid in started if alive(pid)}
        assert not left, f"left behind: {left}\n" + up.output()[-3000:]
        assert not group_members(server["server"])
    finally:
        if record.exists():
            for pid in group_members(json.loads(record.read_text())["server"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# Installed before any page script: every text the status line shows, in order, so a test
# can tell that the engine's progress was on screen before the reply (a MutationObserver
# misses nothing that polling could).
RECORD_STATUS = """
window.__status = [];
document.addEventListener("htmx:wsOpen", function () { window.__wsOpen = (window.__wsOpen || 0) + 1; });
document.addEventListener("click", function (evt) {
  if (evt.target && evt.target.id === "send") { window.__sentAt = performance.now(); }
}, true);
document.addEventListener("DOMContentLoaded", function () {
  var status = document.getElementById("status");
  if (!status) { return; }
  new MutationObserver(function () {
    var text = status.textContent.trim();
    var log = window.__status;
    if (text && (!log.length || log[log.length - 1][1] !== text)) {
      log.push([performance.now(), text]);
    }
  }).observe(status, { subtree: true, childList: true, characterData: true });
});
"""


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no system Chromium at {CHROMIUM}")
def test_a_newcomer_logs_in_with_a_printed_demo_account_and_sees_progress_then_a_reply(
    up: Up,
) -> None:
    """Fresh database -> demo account printed by bin/up -> log in -> "My choices" -> session
    -> the page shows the counselor at work within a second of Send -> the reply."""
    up.wait_for("healthy /healthz", lambda: healthz(up.url) is not None)
    accounts = DEMO_LINE.findall(up.output())
    username, password = next((name, pw) for role, name, pw in accounts if role == "client")
    with sync_playwright() as playwright, chromium(playwright) as browser:
        browser.set_default_timeout(60_000)
        browser.add_init_script(RECORD_STATUS)
        page = browser.new_page()
        page.goto(up.url)
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="My choices")).to_be_visible()
        expect(page.get_by_role("alert")).to_contain_text("please agree to counseling")
        page.get_by_label("Counseling with the AI counselor").check()
        page.get_by_role("button", name="Save my choices").click()
        expect(page.get_by_role("heading", name="My sessions")).to_be_visible()
        page.get_by_role("button", name="Start session").click()
        expect(page.get_by_text("You are talking with an AI counselor")).to_be_visible()
        page.wait_for_function("() => (window.__wsOpen || 0) > 0")

        page.get_by_label("Message").fill("I have been feeling low since the winter started")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator("#transcript .turn-counselor")).to_have_count(1, timeout=120_000)
        log: list[tuple[float, str]] = page.evaluate("() => window.__status")
        sent_at: float = page.evaluate("() => window.__sentAt")
    shown = [text for _, text in log]
    assert log[0][0] - sent_at < 1_000, log  # the page answers Send at once
    assert shown[0].startswith("Sending your message"), shown
    assert any("possible replies written" in text for text in shown), shown  # engine steps
    assert any("comparisons done" in text for text in shown), shown
