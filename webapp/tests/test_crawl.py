"""Every page of the site, GET as every kind of user: never a 5xx, never a traceback.

The URLconf is walked (so a new page is crawled without editing this test); path ids are
filled with objects of the security suite's world, so pages render with real data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from webapp.tests.security.conftest import World, build_world, login

ROLES = ("anonymous", "client_a", "clinician_a", "admin")


@pytest.fixture
def crawl_world(db: Any, settings: Any, tmp_path: Any) -> World:
    """The security suite's world (its ``adapter_dir`` fixture lives in that folder)."""
    settings.ADAPTER_DIR = tmp_path / "adapters"
    if hasattr(settings, "PSYEVO_REQUIRE_MFA"):
        settings.PSYEVO_REQUIRE_MFA = True
    return build_world(tmp_path / "adapter-files")


def _patterns(
    resolver: URLResolver, namespace: str = "", prefix: str = ""
) -> Iterator[tuple[str, URLPattern, str]]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            if str(entry.pattern).startswith("admin/"):
                continue  # Django's admin: its own tests; its index is crawled below
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _patterns(entry, ns, prefix + str(entry.pattern))
        elif entry.name:
            yield namespace + entry.name, entry, prefix + str(entry.pattern)


def _id_for(world: World, route: str, param: str) -> int:
    """An existing object for a path parameter, chosen by what the route is about."""
    if param == "client_id":
        return world.client_a.pk
    if param == "item_id" or route.startswith("memory/"):
        return world.memory_a.pk
    for marker, obj in (
        ("flags/", world.flag_a),
        ("adapters/simulations/", world.run),
        ("adapters/", world.pending),
        ("erasures/", world.erasure),
        ("runs/", world.run),
        ("sessions/", world.open_a),
    ):
        if marker in route:
            return int(obj.pk)
    return 1


def urls(world: World) -> list[str]:
    out = ["/admin/"]
    for name, pattern, route in _patterns(get_resolver()):
        params = list(pattern.pattern.converters)
        kwargs = {p: _id_for(world, route, p) for p in params}
        out.append(reverse(name, kwargs=kwargs))
        if "sessions/" in route and params:  # an ended session too
            out.append(reverse(name, kwargs={**kwargs, params[0]: world.session_a.pk}))
    return out


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES)
def test_every_page_answers_every_role_without_a_server_error(
    crawl_world: World, role: str
) -> None:
    world = crawl_world
    user = world.users[role]
    seen: list[tuple[str, int]] = []
    for url in urls(world):
        client = login(Client(), user)  # a fresh log-in: /logout/ is crawled too
        response = client.get(url)
        body = b"".join(response) if response.streaming else response.content
        # /healthz answers 503 by design while a dependency (here: no model) is not ready.
        server_error = response.status_code >= 500 and not (
            url == "/healthz" and response.status_code == 503 and b'"failing"' in body
        )
        assert not server_error, f"{role} GET {url}: {response.status_code}"
        assert b"Traceback" not in body, f"{role} GET {url}"
        seen.append((url, response.status_code))
    assert len(seen) > 40 and any(code == 200 for _, code in seen)
