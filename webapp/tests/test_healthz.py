from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from webapp.celery import app as celery_app

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def celery_worker_process(settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A real worker process on the real broker, as production runs it."""
    queue = f"healthz-{os.getpid()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "webapp",
            "worker",
            "--pool",
            "solo",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "true"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if celery_app.control.ping(destination=[f"{queue}@{os.uname().nodename}"], timeout=0.5):
                break
            assert proc.poll() is None, "celery worker exited early"
        else:
            pytest.fail("celery worker did not answer pings within 60 s")
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_it_reports_503_naming_redis_when_redis_is_unreachable(client, settings):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["redis"]["status"] == "down"
    assert "redis" in body["failing"]
    assert body["checks"]["celery"]["status"] == "unknown"


def test_it_reports_200_when_database_redis_and_a_worker_are_up(client, celery_worker_process):  # type: ignore[no-untyped-def]
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ok"
    assert {c["status"] for c in body["checks"].values()} == {"ok"}


def test_it_reports_503_naming_celery_without_a_worker(client, settings, monkeypatch):  # type: ignore[no-untyped-def]
    settings.HEALTHZ_TIMEOUT_SECONDS = 0.3
    monkeypatch.setattr(celery_app.control, "ping", lambda timeout: [])
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["celery"]
