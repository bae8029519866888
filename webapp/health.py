"""/healthz: is each part this process depends on reachable right now?

Each check is bounded by HEALTHZ_TIMEOUT_SECONDS so a dead dependency yields a 503 that
names it instead of a hanging probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

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
    from webapp.celery import app

    replies = app.control.ping(timeout=settings.HEALTHZ_TIMEOUT_SECONDS)
    if not replies:
        return "no worker answered a ping"
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "database": check_database,
    "redis": check_redis,
    "celery": check_celery,
}


def run_checks() -> dict[str, dict[str, str]]:
    results: dict[str, dict[str, str]] = {}
    for name, check in CHECKS.items():
        if name == "celery" and results.get("redis", {}).get("status") != "ok":
            # The broker is Redis: pinging workers through a dead broker only hangs.
            results[name] = {"status": "unknown", "error": "broker unreachable"}
            continue
        try:
            problem = check()
        except Exception as exc:  # any failure of a dependency is a reportable state
            log.warning("healthz: %s check failed: %s", name, exc)
            results[name] = {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:200]}
        else:
            results[name] = {"status": "down", "error": problem} if problem else {"status": "ok"}
    return results


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    results = run_checks()
    failing = [name for name, result in results.items() if result["status"] != "ok"]
    body = {"status": "ok" if not failing else "fail", "failing": failing, "checks": results}
    return JsonResponse(body, status=200 if not failing else 503)
