"""scripts/vllm_supervisor.py, which bin/vllm runs: the server it starts, and its restart
and stop logic against a stand-in server whose engine "dies" (its /health turns 500, its
port closes or its process exits) or is merely slow; then ``bin/vllm`` itself, run from
a clean shell over a stand-in ``.venv-vllm`` (webapp/tests/vllm_stub.py), stopped by a
real SIGTERM. The real server is in the vllm tests (test_vllm_live.py)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from counselor_engine.lipo.config import TARGET_MODULES
from scripts import vllm_supervisor as sup
from webapp.tests.vllm_stub import ROOT, group_members, make_stub_venv, stub_model


def parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


@given(st.sets(st.integers(0, 255), min_size=1))
def test_the_cpu_list_names_exactly_the_cpus(cpus: set[int]) -> None:
    text = sup.cpu_list(cpus)
    assert parse_cpu_list(text) == cpus and "all" not in text


def test_the_server_gets_lora_everywhere_the_trainer_puts_it_and_never_on_the_head() -> None:
    args, extra = sup.parse(["--port", "8123", "--enforce-eager"])
    cmd = sup.server_command(args, extra)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # no `vllm` command
    assert "--enable-lora" in cmd and cmd[cmd.index("--port") + 1] == "8123"
    targets = cmd[cmd.index("--lora-target-modules") + 1 :]
    targets = targets[: next(i for i, a in enumerate(targets) if a.startswith("--"))]
    assert set(TARGET_MODULES) <= set(targets) and "lm_head" not in targets
    assert cmd[-1] == "--enforce-eager"  # unknown options go on to vLLM


def test_the_environment_allows_runtime_lora_and_binds_to_our_cpus() -> None:
    env = sup.server_env({})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert parse_cpu_list(env["VLLM_CPU_OMP_THREADS_BIND"]) == os.sched_getaffinity(0)
    assert sup.server_env({"VLLM_CPU_OMP_THREADS_BIND": "0"})["VLLM_CPU_OMP_THREADS_BIND"] == "0"


# A stand-in server: answers /health 200 for HEALTHY_FOR seconds, then, by MODE,
#   500     answers 500 forever (its engine died; the process stays up, as vLLM's API
#           process does with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1),
#   refuse  closes its port and lives on (connection refused),
#   exit    exits (vLLM 0.32's API process after its engine died),
#   slow    answers 200 only after SLOW_S: busy but healthy, every poll times out,
# and counts its starts.
STAND_IN = textwrap.dedent(
    """
    import http.server, os, sys, time
    port, healthy_for, starts, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    with open(starts, "a") as f:
        f.write("start\\n")
    born = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            alive = time.monotonic() - born < healthy_for
            if not alive and mode == "slow":
                time.sleep(2.0)
            self.send_response(200 if alive or mode == "slow" else 500)
            self.end_headers()
    class S(http.server.ThreadingHTTPServer):
        daemon_threads = True
        def handle_error(self, *a):  # the poller gave up on a slow answer: fine
            pass
        def service_actions(self):
            if time.monotonic() - born >= healthy_for:
                if mode == "refuse":
                    self.socket.close()
                    while True:
                        time.sleep(1)
                if mode == "exit":
                    os._exit(3)
    S(("127.0.0.1", port), H).serve_forever(poll_interval=0.05)
    """
)


class Supervised:
    """A Supervisor of the stand-in, run on a thread; ``starts()`` counts its servers."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, **over: float):
        from webapp.counseling.tests.browser_support import free_port

        self.port = free_port()
        self.starts_file = tmp_path / "starts"
        script = tmp_path / "stand_in.py"
        script.write_text(STAND_IN)
        healthy_for = str(over.pop("healthy_for", 1.5))
        monkeypatch.setattr(
            sup,
            "server_command",
            lambda args, extra: [
                sys.executable, str(script), str(self.port), healthy_for, str(self.starts_file), mode,
            ],
        )  # fmt: skip
        monkeypatch.setattr(sup, "DATA_DIR", tmp_path)
        settings = {
            "host": "127.0.0.1", "port": self.port, "served_name": "m", "interval": 0.2,
            "health_timeout": 1.0, "failures": 2, "unanswered_window": 300.0,
            "startup_timeout": 30.0, "max_failed_starts": 3, "grace": 5.0,
        }  # fmt: skip
        self.supervisor = sup.Supervisor(argparse.Namespace(**{**settings, **over}), [])
        self.result: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(self.supervisor.run()), daemon=True
        )
        self.thread.start()

    def starts(self) -> int:
        return self.starts_file.read_text().count("start") if self.starts_file.exists() else 0

    def wait_for_starts(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.starts() < n:
            time.sleep(0.1)
        assert self.starts() >= n, f"{self.starts()} starts, expected {n}"

    def stop(self) -> None:
        self.supervisor.request_stop(15, None)  # what SIGTERM does
        self.thread.join(timeout=30)
        assert self.result == [0] and not self.thread.is_alive()


@pytest.mark.parametrize("mode", ["500", "refuse", "exit"])
def test_it_restarts_a_server_on_evidence_of_death(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A 5xx /health, a refused connection and an exited process each mean dead."""
    run = Supervised(tmp_path, monkeypatch, mode)
    try:
        run.wait_for_starts(2)
    finally:
        run.stop()


def test_a_busy_server_whose_health_polls_time_out_is_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polls that time out are no evidence: a busy server on two shared cores keeps its
    requests in flight. Many more timed-out polls than ``failures`` must not restart it."""
    run = Supervised(
        tmp_path, monkeypatch, "slow", healthy_for=0.5, health_timeout=0.3, interval=0.1
    )
    try:
        run.wait_for_starts(1)
        first = run.supervisor.proc
        time.sleep(4.0)  # ~10 polls, each timing out after 0.3 s
        assert run.starts() == 1 and run.supervisor.proc is first
    finally:
        run.stop()


def test_a_server_that_answers_no_poll_for_the_whole_window_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Supervised(
        tmp_path, monkeypatch, "slow", healthy_for=0.5, health_timeout=0.3, interval=0.1,
        unanswered_window=1.5,
    )  # fmt: skip
    try:
        run.wait_for_starts(2)
    finally:
        run.stop()


def test_the_unanswered_window_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert sup.parse([])[0].unanswered_window == 300.0
    monkeypatch.setenv("PSYEVO_VLLM_UNANSWERED_WINDOW", "42")
    assert sup.parse([])[0].unanswered_window == 42.0


def test_it_restarts_a_server_whose_engine_died_and_stops_it_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Supervised(tmp_path, monkeypatch, "500")
    run.wait_for_starts(2)
    pidfile = tmp_path / "vllm" / f"{run.port}.json"
    assert pidfile.is_file()
    server = run.supervisor.proc
    assert server is not None
    run.stop()
    assert server.poll() is not None and not sup.pid_alive(server.pid)
    assert not pidfile.exists()


def wait_until(what: str, ready: object, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s:\n{log.read_text()}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "stubborn", [False, True], ids=["server-obeys-term", "server-ignores-term"]
)
def test_sigterm_to_bin_vllm_ends_the_server_and_its_children_within_the_grace_period(
    tmp_path: Path, stubborn: bool
) -> None:
    """bin/vllm from a clean shell: it finds its install stamp, execs the supervisor, which
    starts the (stand-in) server in a group of its own with an engine child that ignores
    SIGTERM. One real SIGTERM to bin/vllm: it exits 0 and nothing of the group is left
    once the grace period is over (SIGTERM to the group, SIGKILL after the grace period
    and for strays)."""
    from webapp.counseling.tests.browser_support import free_port

    grace, port = 3.0, free_port()
    record, log = tmp_path / "record.json", tmp_path / "bin-vllm.log"
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PSYEVO_VLLM_VENV": str(make_stub_venv(tmp_path / "venv-vllm")),
        "PSYEVO_VLLM_MODEL_PATH": str(stub_model(tmp_path / "model")),
        "PSYEVO_DATA_DIR": str(tmp_path / "data"),
        "VLLM_PORT": str(port),
        "STAND_IN_RECORD": str(record),
        "STAND_IN_IGNORE_TERM": "1" if stubborn else "0",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bin/vllm", "--grace", str(grace), "--interval", "0.5"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until("ready server", lambda: "ready in" in log.read_text(), 60, log)
        assert "installing" not in log.read_text()  # the stamp matched: nothing installed
        server = json.loads(record.read_text())
        members = group_members(server["server"])
        assert {server["server"], server["engine"]} <= members, members
        assert proc.pid not in members  # the server's group is its own, not bin/vllm's
        assert "--enable-lora" in server["argv"] and "lm_head" not in server["argv"]

        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert proc.wait(timeout=grace + 15) == 0, log.read_text()
        wait_until("empty group", lambda: not group_members(server["server"]), 5, log)
        took = time.monotonic() - stopped
        assert took < grace + 2.0, f"took {took:.1f} s\n{log.read_text()}"
        if not stubborn:
            assert took < grace, f"took {took:.1f} s\n{log.read_text()}"
        assert not (tmp_path / "data" / "vllm" / f"{port}.json").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if record.exists():
            for pid in group_members(json.loads(record.read_text())["server"]):
                os.kill(pid, signal.SIGKILL)
