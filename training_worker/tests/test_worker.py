"""Rounds through a real Celery worker on the real Redis broker and PostgreSQL.

Each test uses its own queue name, so it never takes (or leaves) work on the shared
``training`` queue. ``transaction=True``: the worker's own connections must see the rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from safetensors.torch import load_file

import training_worker.tasks  # noqa: F401  (registers the task with the app)
from counselor_engine.lipo.config import LipoConfig
from webapp.accounts.tests.factories import ClientProfileFactory, ClinicianFactory
from webapp.celery import app
from webapp.counseling.models import Course, Session
from webapp.counseling.tests.browser_support import database_url
from webapp.learning import services
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.schedule import TASK_NAME, note_session_completed
from webapp.learning.tests.helpers import make_evidence, make_version

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
WAIT = 240.0  # seconds; generous for 2 busy CPU cores, never part of an assertion


def wait_for(predicate: Any, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_state(run: TrainingRun) -> TrainingRun:
    return TrainingRun.objects.get(pk=run.pk)


@pytest.fixture
def worker(lipo_settings: Any) -> Iterator[str]:
    """A Celery worker thread (solo pool) consuming this test's queue."""
    queue = lipo_settings.LIPO.queue
    with start_worker(
        app, pool="solo", perform_ping_check=False, queues=[queue], shutdown_timeout=30
    ):
        yield queue
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_scheduled_round_runs_on_the_worker_and_waits_for_approval(lipo_settings, worker):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, sessions_per_round=2)
    base_file = Path(lipo_settings.PSYEVO_MODEL_PATH) / "model.safetensors"
    base_sha = sha(base_file)
    make_evidence()
    for _ in range(2):
        with transaction.atomic():
            queued = note_session_completed(None)
    assert queued  # the second session made the round due; the task went out on commit
    run = TrainingRun.objects.get()

    wait_for(lambda: run_state(run).status not in ("queued", "running"), "the round to finish")

    run = run_state(run)
    version = run.output_version
    assert run.status == "succeeded" and version.status == "pending_approval"
    weights = load_file(str(Path(version.path) / "adapter_model.safetensors"))
    assert all("lora_" in key for key in weights)
    assert any(
        float(w.abs().sum()) > 0 for k, w in weights.items() if "lora_B" in k
    )  # B starts at 0
    assert sha(base_file) == base_sha  # the base model is never written
    assert services.active_version() is None  # nothing reaches a client before approval

    user = ClientProfileFactory().user
    course = Course.objects.create(client=user, modality="cbt")
    in_progress = Session.objects.create(course=course, client=user, index=0,
                                         adapter_version=services.active_version())  # fmt: skip
    services.approve(version, ClinicianFactory())
    in_progress.refresh_from_db()
    assert in_progress.adapter_version is None  # keeps the base model it started with
    assert services.active_version() == version  # sessions starting now get the new version


def _subprocess_env(lipo: LipoConfig, adapter_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        # The test database, also where it is reached by a unix socket (bin/test's embedded
        # PostgreSQL): a host:port URL sent the worker to the system server's socket.
        "DATABASE_URL": database_url(connection.settings_dict),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "PSYEVO_TESTING": "true",
        "PSYEVO_TEST_HANG_PHASE": "optimise",
        "PSYEVO_MODEL_PATH": str(settings.PSYEVO_MODEL_PATH),
        "PSYEVO_ADAPTER_DIR": str(adapter_dir),
        "LIPO_BATCH_EDGES": str(lipo.batch_edges),
        "LIPO_MIN_GROUPS": str(lipo.min_groups),
        "LIPO_MODALITIES": ",".join(lipo.modalities),
        "LIPO_MIN_SHARE": str(lipo.min_share),
        "LIPO_LORA_RANK": str(lipo.lora_rank),
        "LIPO_STEPS": str(lipo.steps),
        "LIPO_MAX_LENGTH": str(lipo.max_length),
        "LIPO_LEASE_MINUTES": "1",
    }
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def redeliver_unacked(queue: str) -> int:
    """What Redis' visibility timeout does for a dead worker's unacked message, now:
    put it back on its queue, marked redelivered."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    count = 0
    for tag, raw in broker.hgetall("unacked").items():
        payload, _exchange, routing_key = json.loads(raw)
        if routing_key != queue:
            continue  # someone else's
        payload["headers"]["redelivered"] = True
        broker.lpush(queue, json.dumps(payload))
        broker.hdel("unacked", tag)
        broker.zrem("unacked_index", tag)
        count += 1
    return count


def test_a_worker_killed_mid_optimisation_leaves_everything_consistent(lipo_settings, tmp_path):  # type: ignore[no-untyped-def]
    from counselor_engine.backends.tiny import build_tiny_adapter

    real = build_tiny_adapter(Path(lipo_settings.PSYEVO_MODEL_PATH), tmp_path / "live", seed=4)
    parent = make_version("v-live", "active", real)
    make_evidence()
    run = TrainingRun.objects.create()
    queue = f"training-test-{uuid.uuid4().hex}"
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queue, "--pool", "solo",
         "-I", "training_worker.tasks", "-n", f"{queue}@%h", "--without-heartbeat",
         "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        cwd=ROOT, env=_subprocess_env(lipo_settings.LIPO, lipo_settings.ADAPTER_DIR),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        app.send_task(TASK_NAME, kwargs={"run_id": run.pk}, queue=queue)
        wait_for(lambda: run_state(run).phase == "optimise", "the optimisation phase", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()

    # 1. Consistent after the kill: the active version unchanged, nothing pending,
    #    the evidence still reserved under a live lease, the run mid-attempt.
    parent.refresh_from_db()
    assert parent.status == "active"
    assert services.adapter_digest(services.servable_path(parent)) == services.adapter_digest(real)
    assert not AdapterVersion.objects.filter(status="pending_approval").exists()
    dead = run_state(run)
    assert (dead.status, dead.phase, dead.attempts) == ("running", "optimise", 1)
    assert dead.output_version.status == "training"
    held = CandidateGroup.objects.filter(lease_run=run, buffer_status="reserved")
    assert held.count() == 4 and all(g.lease_expires_at > timezone.now() for g in held)
    assert services.release_expired_leases() == 0  # not before the lease expires

    # 2. Had the message never come back: once the lease expires, the evidence returns
    #    and the run is failed (shown, then undone, to go on with the redelivery below).
    with transaction.atomic():
        later = timezone.now() + timedelta(minutes=2)
        assert services.release_expired_leases(now=later) == 4
        assert run_state(run).status == "failed"
        assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {"available"}
        transaction.set_rollback(True)

    # 3. The broker redelivers the unacked message: a second attempt takes over,
    #    fails the dead attempt's version and completes the round.
    assert redeliver_unacked(queue) == 1
    with start_worker(
        app, pool="solo", perform_ping_check=False, queues=[queue], shutdown_timeout=30
    ):
        wait_for(lambda: run_state(run).status != "running", "the second attempt")
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)
    done = run_state(run)
    assert (done.status, done.attempts) == ("succeeded", 2), done.error
    assert done.output_version.status == "pending_approval"
    assert AdapterVersion.objects.get(pk=dead.output_version_id).status == "failed"
    parent.refresh_from_db()
    assert parent.status == "active"
    assert sorted(g.pk for g in CandidateGroup.objects.filter(lease_run=run)) == sorted(done.batch)
