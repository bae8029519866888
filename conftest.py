"""Test-wide fixtures: real PostgreSQL and Redis always (see README), fast hashing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _private_crisis_spool(settings, tmp_path):  # type: ignore[no-untyped-def]
    """Crises held with PostgreSQL down are spooled to disk and replayed by any process
    sharing the folder: a test's records must never reach another test database."""
    settings.CRISIS_SPOOL_DIR = tmp_path / "crisis-spool"


@pytest.fixture(autouse=True)
def _fresh_channel_layer():  # type: ignore[no-untyped-def]
    """Give each test its own (real, Redis) channel layer instance.

    channels caches one layer per process, and channels-redis keeps receive locks and
    counters on it. Each async test has its own event loop, so a consumer task a failed
    test leaves behind would hold that state across loops and break every later socket
    test ("Lock ... bound to a different event loop"). One process = one loop in
    production, where the cache is right.
    """
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
async def close_thread_db_connections():  # type: ignore[no-untyped-def]
    """Async tests open DB connections in asgiref's worker thread; close them after the
    test so the test database can be dropped (use in consumer tests)."""
    yield
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    from webapp.counseling.consumers import _writers

    # Reply writers outlive a socket closed mid-reply (so the reply is still stored): let
    # them finish inside the test, not during the event loop's teardown.
    loop = asyncio.get_running_loop()
    pending = [t for t in _writers if not t.done() and t.get_loop() is loop]
    if pending:
        _, late = await asyncio.wait(pending, timeout=60)
        for task in late:
            task.cancel()
    await sync_to_async(connections.close_all)()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A tiny random-weight chat model built in code (exact, offline, fast)."""
    from counselor_engine.backends.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def tiny_engine(settings, tiny_model_dir):  # type: ignore[no-untyped-def]
    """Point the web process's engine at the tiny model with small, fast settings."""
    from webapp.counseling import runtime

    settings.PSYEVO_BACKEND = "transformers"
    settings.PSYEVO_MODEL_PATH = str(tiny_model_dir)
    # In-process: a child per test would cost seconds each; the child path has its own tests
    # (counselor_engine/tests/test_backend_process.py, webapp/counseling/tests/test_model_process.py).
    settings.PSYEVO_MODEL_PROCESS = False
    settings.PSYEVO_CANDIDATES = 3
    settings.PSYEVO_MAX_NEW_TOKENS = 12
    runtime.reset_backend()
    yield tiny_model_dir
    runtime.reset_backend()


@pytest.fixture
def broken_engine(settings, tmp_path):  # type: ignore[no-untyped-def]
    """A model backend that cannot start: every model call fails."""
    from webapp.counseling import runtime

    settings.PSYEVO_BACKEND = "transformers"
    settings.PSYEVO_MODEL_PATH = str(tmp_path / "no-such-model")
    settings.PSYEVO_MODEL_PROCESS = False
    runtime.reset_backend()
    yield
    runtime.reset_backend()


# -- a private Redis to stop under an open socket ------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) but never answers: a server that
    hangs, for the backends' timeouts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


@pytest.fixture
def private_redis(tmp_path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # type: ignore[no-untyped-def]
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            if redis.Redis.from_url(url, socket_connect_timeout=0.2).ping():
                break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("private redis-server did not start")
    yield url, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def on_private_redis(settings, private_redis):  # type: ignore[no-untyped-def]
    """Channel layer, cache, reply lock and Celery broker all on the private server."""
    from webapp.celery import app as celery_app

    url, proc = private_redis
    layers = json.loads(json.dumps(settings.CHANNEL_LAYERS))
    layers["default"]["CONFIG"]["hosts"] = [{"address": url, "socket_timeout": 2}]
    settings.CHANNEL_LAYERS = layers  # channels drops its cached layer on this change
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                                      "LOCATION": url}}  # fmt: skip
    settings.REDIS_URL = url
    old_broker = celery_app.conf.broker_url
    celery_app.conf.broker_url = url
    # Forget pooled broker connections to the shared server. Not celery_app.close(): that
    # also deregisters the app, and a task module imported afterwards (the web side queues
    # tasks by name, so tests may import one first) would then not register with it.
    celery_app._pool = None
    yield proc
    celery_app.conf.broker_url = old_broker
    celery_app._pool = None


# -- the real vLLM server (tests marked vllm) ------------------------------------------------
@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A healthy vLLM server with LoRA: ``$PSYEVO_VLLM_URL``, else one ``bin/vllm`` starts
    for this test run (and stops after it). Never a skip: no server is a failure."""
    from counselor_engine import models
    from counselor_engine.tests import vllm_server

    url = os.environ.get("PSYEVO_VLLM_URL", "").rstrip("/").removesuffix("/v1")
    if url:
        try:
            vllm_server.wait_healthy(url, timeout=120)
        except RuntimeError as exc:
            pytest.fail(f"PSYEVO_VLLM_URL={url}: {exc}")
        yield url
        return
    log = tmp_path_factory.mktemp("vllm") / "bin-vllm.log"
    try:
        with vllm_server.started_server(log, models.ensure_default_model()) as started:
            yield started
    except RuntimeError as exc:
        pytest.fail(f"bin/vllm did not serve: {exc}")
