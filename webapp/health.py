"""/healthz: is each part this process depends on reachable right now?

Each check is bounded by HEALTHZ_TIMEOUT_SECONDS so a dead dependency yields a 503 that
names it instead of a hanging probe.

Anyone may ask, so what an anonymous caller gets is bounded too (issue 18): each check's
status and the failing names, never the error text (it can hold host names, ports or
worse), and a Celery result at most ``CELERY_PING_CACHE_SECONDS`` old, so a flood of
probes cannot make this process broadcast a ping to every worker per request. Staff
(clinicians and admins) and direct requests from this machine get the error text and a
fresh ping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from webapp.accounts.mfa import STAFF_ROLES
from webapp.celery import app as celery_app

log = logging.getLogger(__name__)


def check_database() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return None


def check_redis() -> str | None:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=settings.HEALTHZ_TIMEOUT_SECONDS,
        socket_timeout=settings.HEALTHZ_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    finally:
        client.close()
    return None


def check_celery() -> str | None:
    replies = celery_app.control.ping(timeout=settings.HEALTHZ_TIMEOUT_SECONDS)
    if not replies:
        return "no worker answered a ping"
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "database": check_database,
    "redis": check_redis,
    "celery": check_celery,
}


CELERY_PING_CACHE_SECONDS = 15.0
_celery_cache: dict[str, Any] = {}  # "at": monotonic time, "result": the last result
_celery_lock = threading.Lock()
LOOPBACK = frozenset({"127.0.0.1", "::1"})
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _run_one(name: str, check: Callable[[], str | None]) -> dict[str, str]:
    try:
        problem = check()
    except Exception as exc:  # any failure of a dependency is a reportable state
        log.warning("healthz: %s check failed: %s", name, exc)
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:200]}
    return {"status": "down", "error": problem} if problem else {"status": "ok"}


def _cached_celery(check: Callable[[], str | None]) -> dict[str, str]:
    """The Celery result, pinged at most once per CELERY_PING_CACHE_SECONDS. The lock
    makes concurrent callers wait for one ping instead of each sending their own."""
    with _celery_lock:
        at = _celery_cache.get("at")
        if at is None or time.monotonic() - at > CELERY_PING_CACHE_SECONDS:
            _celery_cache.update(result=_run_one("celery", check), at=time.monotonic())
        return dict(_celery_cache["result"])


def run_checks(*, cached_celery: bool = False) -> dict[str, dict[str, str]]:
    results: dict[str, dict[str, str]] = {}
    for name, check in CHECKS.items():
        if name == "celery" and results.get("redis", {}).get("status") != "ok":
            # The broker is Redis: pinging workers through a dead broker only hangs.
            results[name] = {"status": "unknown", "error": "broker unreachable"}
        elif name == "celery" and cached_celery:
            results[name] = _cached_celery(check)
        else:
            results[name] = _run_one(name, check)
    return results


def may_see_detail(request: HttpRequest) -> bool:
    """Staff, or a request made on this machine directly (not relayed by a proxy there:
    a local reverse proxy would make every outside caller look local)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and getattr(user, "role", None) in STAFF_ROLES:
        return True
    relayed = any(request.META.get(header) for header in PROXY_HEADERS)
    return request.META.get("REMOTE_ADDR") in LOOPBACK and not relayed


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    detail = may_see_detail(request)
    results = run_checks(cached_celery=not detail)
    failing = [name for name, result in results.items() if result["status"] != "ok"]
    if not detail:
        results = {name: {"status": result["status"]} for name, result in results.items()}
    body = {"status": "ok" if not failing else "fail", "failing": failing, "checks": results}
    return JsonResponse(body, status=200 if not failing else 503)
