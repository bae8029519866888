"""Refused websocket handshakes leak nothing: Redis connections and server file descriptors.

Issue 9, item 2: "10,000 refused handshakes leave Redis ``connected_clients`` flat". A real
Daphne server (the Procfile's ``web`` line, through ``scripts.cluster.Cluster``) with one
Celery worker (so ``/healthz`` can answer 200) serves the test database; its channel layer,
cache and broker are a PRIVATE redis-server, so ``connected_clients`` counts only this
server's connections, never those of tests running beside it on the shared Redis.

Each handshake is one the server must refuse, in four kinds (what refuses it):
foreign Origin and missing Origin (``AllowedHostsOriginValidator``), no session cookie
(the consumer closes with 4401 before accepting) and client B asking for client A's session
(4404 before accepting). A close before ``accept`` is answered by Daphne with HTTP 403, so
every refusal is checked as a 403 (or, should the server ever accept first, an immediate
close with a 4xxx code); a connection Daphne drops unanswered after its 5 s open-handshake
timeout (seen only on an overloaded machine in the 10,000 run) never opened either and is
counted as ``dropped``. A warm-up round runs first, so one-time growth (the thread pool,
pooled connections) is not taken for a leak; the figures are read before, just after and
after a short settle. Afterwards the server is still healthy and client A still reaches
its own session. 10,000 handshakes take over a minute here, so that variant is ``slow``;
the default run has 1,000. Prints ``refused handshakes: {json}`` for the reliability report.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus
from websockets.typing import Origin

from scripts.cluster import Cluster
from webapp.counseling.tests.browser_support import server_env, wait_for_other_db_sessions_to_end
from webapp.tests.security.conftest import World, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 100
WARM_UP = 200
SETTLE_S = 3.0
REDIS_ALLOWANCE = 5  # connections: a pool may keep a few more after a burst
FD_ALLOWANCE = 10  # descriptors: the same, plus the Django connections of pool threads
KINDS = ("foreign_origin", "missing_origin", "anonymous", "other_clients_session")


@pytest.fixture
def server(
    transactional_db: Any,
    tiny_model_dir: Path,
    tmp_path: Path,
    private_redis: tuple[str, Any],
) -> Iterator[tuple[Cluster, str]]:
    """One Daphne and one default worker on the test database and the private Redis."""
    url, _ = private_redis
    env = {
        **server_env(str(tiny_model_dir), max_new_tokens=8),
        "REDIS_URL": url,
        "CELERY_BROKER_URL": url,
    }
    cluster = Cluster(asgi=1, workers=("default",), env=env, log_dir=tmp_path / "logs")
    try:
        with cluster:
            yield cluster, url
    finally:
        for proc in cluster.procs.values():  # shown when the test fails
            print(f"--- {proc.name} (tail) ---\n{proc.log_tail(2000)}")
        wait_for_other_db_sessions_to_end()


def connected_clients(url: str) -> int:
    """``connected_clients`` of the server's Redis, less this probe's own connection."""
    probe = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        return int(probe.info("clients")["connected_clients"]) - 1
    finally:
        probe.close()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def healthz(base: str) -> int:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def handshake_args(kind: str, world: World, base_ws: str, cookies: dict[str, str]) -> Any:
    """(url, extra headers, origin) of one handshake of ``kind`` (all must be refused)."""
    own = "http://" + base_ws.removeprefix("ws://")
    chat_a = f"{base_ws}/ws/sessions/{world.open_a.pk}/"
    if kind == "foreign_origin":
        return chat_a, {"Cookie": cookies["a"]}, "https://evil.example.com"
    if kind == "missing_origin":
        return chat_a, {"Cookie": cookies["a"]}, None
    if kind == "anonymous":
        return chat_a, {}, own
    if kind == "other_clients_session":
        return chat_a, {"Cookie": cookies["b"]}, own
    raise ValueError(f"unknown handshake kind {kind!r}")


async def one_handshake(url: str, headers: dict[str, str], origin: str | None) -> str:
    """How the server answered: ``http-<status>``, ``close-<code>``, ``dropped`` or
    ``accepted``."""
    try:
        async with connect(
            url,
            additional_headers=headers,
            origin=Origin(origin) if origin is not None else None,
            open_timeout=30,
            close_timeout=5,
        ) as ws:
            try:
                await asyncio.wait_for(ws.recv(), timeout=5)
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else 1006
                return f"close-{code}"
            except TimeoutError:
                pass
            return "accepted"
    except InvalidStatus as exc:
        return f"http-{exc.response.status_code}"
    except InvalidMessage:
        # The TCP connection closed before any HTTP answer: Daphne's 5 s open-handshake
        # timeout on a busy machine. Never opened, so refused, but counted on its own.
        return "dropped"


async def hammer(plans: list[tuple[str, Any]]) -> Counter[str]:
    """Every ``(kind, handshake)`` in ``plans``, ``BATCH`` at a time: ``{"kind outcome": n}``."""

    async def labelled(kind: str, plan: Any) -> str:
        return f"{kind} {await one_handshake(*plan)}"

    outcomes: Counter[str] = Counter()
    for start in range(0, len(plans), BATCH):
        batch = plans[start : start + BATCH]
        outcomes.update(await asyncio.gather(*(labelled(*plan) for plan in batch)))
    return outcomes


async def own_session_works(base_ws: str, world: World, cookie: str) -> bool:
    own = "http://" + base_ws.removeprefix("ws://")
    url = f"{base_ws}/ws/sessions/{world.open_a.pk}/"
    async with connect(url, additional_headers={"Cookie": cookie}, origin=Origin(own)) as ws:
        await ws.send(json.dumps({"type": "ping"}))
        frame = await asyncio.wait_for(ws.recv(), timeout=30)
    return 'id="status"' in str(frame)  # the answer to a ping


def refused(labelled: str) -> bool:
    outcome = labelled.rpartition(" ")[2]
    if outcome == "dropped":
        return True
    if outcome.startswith("http-"):
        return outcome == "http-403"
    return outcome.startswith("close-4")


@pytest.mark.parametrize(
    "count", [1_000, pytest.param(10_000, marks=pytest.mark.slow)], ids=["1k", "10k"]
)
def test_refused_handshakes_leave_redis_and_descriptors_flat(
    server: tuple[Cluster, str], world: World, count: int
) -> None:
    cluster, redis_url = server
    base, base_ws = cluster.urls[0], cluster.ws_urls[0]
    pid = cluster.asgi_proc(0).popen.pid  # type: ignore[union-attr]
    cookies = {
        "a": session_cookie(world.client_a)[0].decode(),
        "b": session_cookie(world.client_b)[0].decode(),
    }
    assert settings.SESSION_COOKIE_NAME in cookies["a"]

    def plans(n: int) -> list[tuple[str, Any]]:
        kinds = [KINDS[i % len(KINDS)] for i in range(n)]
        return [(kind, handshake_args(kind, world, base_ws, cookies)) for kind in kinds]

    warm = asyncio.run(hammer(plans(WARM_UP)))
    assert all(refused(o) for o in warm), warm
    time.sleep(SETTLE_S)
    redis_before, fds_before = connected_clients(redis_url), open_fds(pid)

    started = time.monotonic()
    outcomes = asyncio.run(hammer(plans(count)))
    elapsed = time.monotonic() - started
    redis_after, fds_after = connected_clients(redis_url), open_fds(pid)
    time.sleep(SETTLE_S)
    redis_settled, fds_settled = connected_clients(redis_url), open_fds(pid)

    health = healthz(base)
    own_ok = asyncio.run(own_session_works(base_ws, world, cookies["a"]))
    figures = {
        "handshakes": count,
        "refused": sum(n for o, n in outcomes.items() if refused(o)),
        "dropped": sum(n for o, n in outcomes.items() if o.endswith(" dropped")),
        "outcomes": dict(outcomes),
        "seconds": round(elapsed, 1),
        "redis_clients": [redis_before, redis_after, redis_settled],
        "server_fds": [fds_before, fds_after, fds_settled],
        "healthz": health,
        "own_session": own_ok,
    }
    print(f"refused handshakes: {json.dumps(figures, sort_keys=True)}")

    assert figures["refused"] == count, outcomes
    assert {o.partition(" ")[0] for o in outcomes} == set(KINDS), outcomes
    assert redis_settled <= redis_before + REDIS_ALLOWANCE, figures
    assert fds_settled <= fds_before + FD_ALLOWANCE, figures
    assert health == 200, figures
    assert own_ok, figures
