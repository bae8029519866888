"""pid_alive: the liveness check that cleanup of dead processes' folders relies on."""

from __future__ import annotations

import os
import subprocess
import sys

from counselor_engine.procs import pid_alive


def test_a_running_process_is_alive_and_a_reaped_one_is_not() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert not pid_alive(child.pid)


def test_it_needs_no_web_framework() -> None:
    code = "import sys, counselor_engine.procs; print(sorted(m for m in ('django', 'celery') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
