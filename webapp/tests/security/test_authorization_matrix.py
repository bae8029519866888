"""Every cell of the authorization matrix (``matrix.py``): role x endpoint, on HTTP pages,
the chat socket and the Django admin. Allowed: the page answers (and a POST has its
effect). Denied: 403/404 (anonymous: the log-in redirect), a ``psyevo.security`` log
line, no effect and none of A's data in the answer."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from webapp.oversight.models import AuditEvent
from webapp.routing import websocket_urlpatterns
from webapp.tests.security.conftest import CANARY_A, ROLES, World, build_world, login, ws_connect
from webapp.tests.security.matrix import (
    ADMIN_SITE,
    CRAWL_ONLY,
    HTTP,
    NOT_APPLICABLE,
    PUBLIC,
    RESOURCES,
    ROWS,
    TRANSPORTS,
    WEBSOCKET,
    Row,
    canary_ok,
)


def _cells(rows: list[Row]) -> list[Any]:
    return [
        pytest.param(row, role, id=f"{row.transport}:{row.name}:{role}")
        for row in rows
        for role in ROLES
        if role not in row.elsewhere
    ]


def _request(row: Row, world: World, role: str) -> Any:
    client = login(Client(), world.users[role])
    path = row.path(world)
    if row.method == "get":
        return client.get(path)
    return client.post(path, row.data(world))


def _effect_done(row: Row, world: World) -> bool:
    return row.effect is not None and row.effect(world)


@pytest.mark.django_db
@pytest.mark.parametrize(("row", "role"), _cells(HTTP + ADMIN_SITE))
def test_http_cell(row: Row, role: str, world: World, security_log: list[Any]) -> None:
    response = _request(row, world, role)
    body = b"" if getattr(response, "streaming", False) else response.content
    if getattr(response, "streaming", False):
        body = b"".join(response.streaming_content)
    text = body.decode(errors="replace")
    assert response.status_code < 500
    if role in row.allowed:
        assert response.status_code not in (403, 404), (response.status_code, text[:300])
        assert "/login/" not in response.get("Location", "")
        if row.effect is not None:
            assert _effect_done(row, world), "an allowed action had no effect"
        assert canary_ok(row, role, text), "A's data shown to the wrong role (or missing)"
        return
    if role == "anonymous":
        assert response.status_code == 302
        assert "login/" in response["Location"]
    else:
        assert response.status_code in (403, 404), (response.status_code, text[:300])
    assert CANARY_A not in text
    assert not _effect_done(row, world), "a denied action took effect"
    assert [r for r in security_log if r.levelno >= logging.INFO], "no security log line"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
@pytest.mark.parametrize(("row", "role"), _cells(WEBSOCKET))
async def test_websocket_cell(
    row: Row, role: str, adapter_dir: Any, security_log: list[Any]
) -> None:
    world = await sync_to_async(build_world)(adapter_dir)
    user = world.users[role]
    comm, connected, code = await ws_connect(row.path(world), user)
    try:
        joined = await sync_to_async(
            AuditEvent.objects.filter(action="session.join", actor=user).exists
        )()
        if role in row.allowed:
            assert connected
            if row.resource == "takeover":
                assert joined, "a clinician's join must be audited"
            await comm.send_json_to({"type": "resync", "after_seq": -1})
            frames = [await comm.receive_from(timeout=10) for _ in range(3)]
            assert any(CANARY_A in f for f in frames), "the resync did not carry the transcript"
            return
        assert not connected
        assert code in (4401, 4403, 4404), code
        assert not joined
        assert [r for r in security_log if r.levelno >= logging.INFO], "no security log line"
    finally:
        if connected:
            await comm.disconnect()


# -- the matrix itself -------------------------------------------------------------------
def test_every_resource_and_transport_has_rows_or_a_reason() -> None:
    covered = {(r.resource, r.transport) for r in ROWS}
    for resource in RESOURCES:
        for transport in TRANSPORTS:
            cell = (resource, transport)
            assert (cell in covered) != (cell in NOT_APPLICABLE), cell


def test_a_client_can_never_approve() -> None:
    for row in ROWS:
        if row.resource in ("adapter_approve", "adapter_activate") and row.method == "post":
            assert not row.allowed & {"client_a", "client_b"}, row.name


def test_the_matrix_knows_every_socket_route() -> None:
    routes = {str(p.pattern) for p in websocket_urlpatterns}
    assert routes == {"ws/notifications/", "ws/sessions/<int:session_id>/"}


def _names(patterns: list[Any], prefix: str = "") -> set[str]:
    names: set[str] = set()
    for p in patterns:
        if isinstance(p, URLResolver):
            if str(p.pattern).startswith("admin/"):
                continue  # the Django admin has its own rows
            names |= _names(p.url_patterns, f"{p.namespace}:" if p.namespace else prefix)
        elif isinstance(p, URLPattern) and p.name:
            names.add(prefix + p.name)
    return names


def test_every_url_pattern_is_in_the_matrix_or_the_crawl() -> None:
    from django.urls import resolve

    in_rows = set()
    for row in HTTP:
        try:
            match = resolve(row.path(_FakeWorld()).split("?")[0])
        except Exception:  # pragma: no cover - a broken row path fails the cell tests
            continue
        in_rows.add(match.view_name)
    unknown = _names(get_resolver().url_patterns) - in_rows - CRAWL_ONLY - PUBLIC
    assert not unknown, f"URL patterns with no authorization rule: {sorted(unknown)}"


class _FakeWorld:
    """Ids only, to resolve row paths without a database."""

    def __getattr__(self, name: str) -> Any:
        return _Obj()


class _Obj:
    pk = 1
    name = "v"

    def __getattr__(self, name: str) -> Any:
        return _Obj()
