"""What /healthz tells whom (issue 18, item 5): error text only to staff and to direct
requests from this machine; anonymous probes share one Celery ping per few seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from webapp import health
from webapp.accounts.tests.factories import AdminFactory, ClientProfileFactory, ClinicianFactory
from webapp.celery import app as celery_app

pytestmark = pytest.mark.django_db

OUTSIDE = {"REMOTE_ADDR": "203.0.113.9"}
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture(autouse=True)
def fresh_ping_cache() -> Iterator[None]:
    health._celery_cache.clear()
    yield
    health._celery_cache.clear()


def no_error_text(body: dict) -> bool:  # type: ignore[type-arg]
    return all(set(check) == {"status"} for check in body["checks"].values())


@pytest.mark.parametrize(
    "meta",
    [OUTSIDE, {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}],
    ids=["outside", "relayed-by-a-local-proxy"],
)
def test_anonymous_callers_get_statuses_without_error_text(client, settings, meta):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = DEAD_REDIS
    response = client.get("/healthz", **meta)
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis", "celery"] and no_error_text(body)
    assert "127.0.0.1:1" not in response.content.decode()
    assert "Error" not in response.content.decode()


def test_a_client_account_is_no_better_than_anonymous(client, settings):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = DEAD_REDIS
    client.force_login(ClientProfileFactory().user)
    assert no_error_text(client.get("/healthz", **OUTSIDE).json())


@pytest.mark.parametrize("staff", [AdminFactory, ClinicianFactory])
def test_staff_and_local_requests_see_the_error_text(client, settings, staff):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = DEAD_REDIS
    local = client.get("/healthz", REMOTE_ADDR="127.0.0.1").json()
    assert local["checks"]["redis"]["error"].startswith("ConnectionError")
    client.force_login(staff())
    remote = client.get("/healthz", **OUTSIDE).json()
    assert "error" in remote["checks"]["redis"]


def test_anonymous_probes_share_one_celery_ping(client, monkeypatch):  # type: ignore[no-untyped-def]
    pings: list[float] = []

    def ping(timeout: float) -> list[dict]:  # type: ignore[type-arg]
        pings.append(timeout)
        return [{"worker@host": {"ok": "pong"}}]

    monkeypatch.setattr(celery_app.control, "ping", ping)
    for _ in range(5):
        assert client.get("/healthz", **OUTSIDE).status_code == 200
    assert len(pings) == 1
    client.get("/healthz", REMOTE_ADDR="127.0.0.1")  # a local diagnosis pings afresh
    assert len(pings) == 2

    monkeypatch.setattr(health, "CELERY_PING_CACHE_SECONDS", 0.0)  # the cache expires
    client.get("/healthz", **OUTSIDE)
    assert len(pings) == 3
