"""scripts/vllm_supervisor.py, which bin/vllm runs: the server it starts, and its restart
and stop logic against a stand-in server whose engine "dies" (its /health turns 500, as
vLLM's does). The real server is in the vllm tests (test_vllm_live.py)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scripts import vllm_supervisor as sup
from training_worker.trainer import TARGET_MODULES


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


# A stand-in server: answers /health 200 for HEALTHY_FOR seconds, then 500 forever (its
# engine died; the process stays up, as vLLM's API process does), and counts its starts.
STAND_IN = textwrap.dedent(
    """
    import http.server, sys, time
    port, healthy_for, starts = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    with open(starts, "a") as f:
        f.write("start\\n")
    born = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            alive = time.monotonic() - born < healthy_for
            self.send_response(200 if alive else 500)
            self.end_headers()
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def test_it_restarts_a_server_whose_engine_died_and_stops_it_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.counseling.tests.browser_support import free_port

    port = free_port()
    starts = tmp_path / "starts"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(
        sup,
        "server_command",
        lambda args, extra: [sys.executable, str(script), str(port), "1.5", str(starts)],
    )
    monkeypatch.setattr(sup, "DATA_DIR", tmp_path)
    args = argparse.Namespace(
        host="127.0.0.1", port=port, served_name="m", interval=0.2, health_timeout=1.0,
        failures=2, startup_timeout=30.0, max_failed_starts=3, grace=5.0,
    )  # fmt: skip
    supervisor = sup.Supervisor(args, [])
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()), daemon=True)
    thread.start()

    def count() -> int:
        return starts.read_text().count("start") if starts.exists() else 0

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and count() < 2:
        time.sleep(0.1)
    assert count() >= 2, "the dead server was not replaced"
    pidfile = tmp_path / "vllm" / f"{port}.json"
    assert pidfile.is_file()
    server = supervisor.proc
    assert server is not None

    supervisor.request_stop(15, None)  # what SIGTERM does
    thread.join(timeout=30)
    assert result == [0] and not thread.is_alive()
    assert server.poll() is not None and not sup.pid_alive(server.pid)
    assert not pidfile.exists()
