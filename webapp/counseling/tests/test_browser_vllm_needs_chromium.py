"""``-m vllm`` skips nothing: test_browser_vllm.py, run that way on a machine without
Chromium, fails (before any vLLM server is started) instead of skipping.

It runs in a pytest of its own, with ``browser_support.CHROMIUM`` pointed at a path that
does not exist and ``PSYEVO_VLLM_URL`` at a closed port, so even a wrong fixture order
could never start ``bin/vllm``: it would fail on the URL instead, with another message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from webapp.counseling.tests.browser_support import free_port

ROOT = Path(__file__).resolve().parents[3]

NO_CHROMIUM = """
from pathlib import Path

def pytest_collection_finish(session):
    from webapp.counseling.tests import browser_support
    browser_support.CHROMIUM = Path("/nonexistent/chromium")
"""


def run_browser_vllm(tmp_path: Path, markexpr: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "psyevo_no_chromium.py").write_text(NO_CHROMIUM)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "PSYEVO_VLLM_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "webapp/counseling/tests/test_browser_vllm.py",
         "-m", markexpr, "-p", "psyevo_no_chromium", "-p", "no:cacheprovider", "-q",
         "--timeout", "120"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_under_m_vllm_a_missing_chromium_fails_the_browser_test(tmp_path: Path) -> None:
    result = run_browser_vllm(tmp_path, "vllm")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "no system Chromium at /nonexistent/chromium" in out, out[-3000:]
    assert "skipped" not in out.splitlines()[-1], out[-3000:]


def test_outside_the_vllm_run_it_still_skips(tmp_path: Path) -> None:
    """``-m browser`` (the browser tests without vLLM) keeps the default suite's skip."""
    result = run_browser_vllm(tmp_path, "browser")
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "1 skipped" in out.splitlines()[-1], out[-3000:]
