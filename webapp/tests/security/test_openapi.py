"""docs/openapi.yaml is true to the site, and schemathesis finds no 5xx in it.

1. Every documented path resolves in Django's URLconf, and the JSON endpoints' real answers
   (the client's data export, /healthz) validate against the documented schemas.
2. For every documented operation, schemathesis generates requests (valid ones and, where
   the operation takes input, invalid ones) and sends them through the real WSGI
   application (the whole middleware stack, the real PostgreSQL test database and Redis)
   as an anonymous visitor, as client A and as client A's clinician. Each answer must be
   no 5xx (``not_a_server_error``), carry no traceback text, and match the documented
   status codes, content types, headers and schemas. Path ids are drawn from the
   ``world``'s real objects (the caller's own and another client's) as well as generated.

CSRF: Django's CsrfViewMiddleware stays on. The werkzeug client schemathesis uses (unlike
Django's test client) does not switch it off, so every fuzzed request carries what a
browser sends: a ``csrftoken`` cookie and the same value in ``X-CSRFToken``. The fuzz thus
reaches the views behind the check; ``test_it_refuses_posts_without_a_csrf_token`` checks
the documented 403 for a POST without one.

Lock-outs: django-axes counts failed log-ins in the database, inside this test's
transaction, so nothing a fuzzed log-in locks survives the test; the log-in fuzz also
resets axes at its end and shows the real user can still log in.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.urls import resolve
from django.utils.crypto import get_random_string
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import APIOperation, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from webapp.accounts.models import User
from webapp.accounts.tests.factories import PASSWORD
from webapp.oversight.models import ClientControl
from webapp.tests.security.conftest import World, session_cookie

SPEC = Path(__file__).resolve().parents[3] / "docs" / "openapi.yaml"
SCHEMA = schemathesis.openapi.from_path(SPEC)


def _operations() -> dict[str, APIOperation]:
    """Every operation of the document; one schemathesis cannot read fails here, loudly."""
    operations = {}
    for result in SCHEMA.get_all_operations():
        if not isinstance(result, Ok):
            raise result.err()
        operations[result.ok().label] = result.ok()
    return operations


OPERATIONS = _operations()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
TRACEBACK = re.compile(rb"Traceback \(most recent call last\)|Exception Value")
FUZZ = hypothesis_settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ROLES = ("anonymous", "client_a", "clinician_a")
HEALTHZ = "GET /healthz"
# What the run saw, for the summary printed at the end of the module (pytest -s shows it).
STATUSES: Counter[tuple[str, int]] = Counter()
GENERATED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _summary() -> Iterator[None]:
    yield
    total = sum(STATUSES.values())
    server_errors = sum(
        n for (label, status), n in STATUSES.items() if status >= 500 and label != HEALTHZ
    )
    health = {status: n for (label, status), n in STATUSES.items() if label == HEALTHZ}
    by_status = Counter[int]()
    for (_, status), n in STATUSES.items():
        by_status[status] += n
    print(
        f"\nschemathesis: {GENERATED.total()} generated cases, {total} requests in all over "
        f"{len(OPERATIONS)} operations, "
        f"{server_errors} with 5xx (besides /healthz: {health}); "
        f"by status {dict(sorted(by_status.items()))}",
        file=sys.stderr,
    )


@pytest.fixture
def app() -> Iterator[WSGIHandler]:
    """Django's WSGI application, as a server runs it, inside the test's transaction.

    A server closes the database connection around each request (``close_old_connections``
    on request_started/finished); inside the test's transaction that would roll it back, so
    the fixture unhooks it while the test runs, as Django's own test client does.
    """
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def server_errors() -> Iterator[list[BaseException]]:
    """Every exception a view let escape (Django's got_request_exception signal)."""
    caught: list[BaseException] = []

    def receiver(sender: Any, request: Any = None, **kwargs: Any) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            caught.append(exc)

    signals.got_request_exception.connect(receiver, weak=False)
    try:
        yield caught
    finally:
        signals.got_request_exception.disconnect(receiver)


def browser(user: User | None, *, csrf: bool = True) -> dict[str, Any]:
    """What a browser of ``user`` sends along: a fresh session and a CSRF token."""
    cookies: dict[str, str] = {}
    headers: dict[str, str] = {}
    if csrf:
        token = get_random_string(32)
        cookies["csrftoken"] = token
        headers["X-CSRFToken"] = token
    if user is not None:
        cookies["sessionid"] = session_cookie(user)[1]
    return {
        "cookies": cookies,
        "headers": headers,
        "environ_base": {"REMOTE_ADDR": "127.0.0.1"},
    }


def send(case: Any, app: WSGIHandler, user: User | None, server_errors: list[BaseException]) -> Any:
    """Send one case as ``user`` and apply every check; returns the response."""
    server_errors.clear()  # each example answers for itself (and shrinks on its own)
    response = case.call(app=app, **browser(user))
    STATUSES[(case.operation.label, response.status_code)] += 1
    # Case's repr hides "username" and "password": say what was sent, unmasked.
    sent = f"path={case.path_parameters} query={case.query!a} body={case.body!a}"
    assert not server_errors, f"{case.operation.label} raised {server_errors[0]!r}: {sent}"
    assert not TRACEBACK.search(response.content or b""), case.operation.label
    checks = CHECKS
    if case.operation.label == HEALTHZ:
        # /healthz answers 503 by design when a dependency is down (here: no Celery worker
        # runs); that 503 is documented and checked against its schema like the 200.
        checks = [check for check in CHECKS if check is not not_a_server_error]
        assert response.status_code in (200, 503)
    case.validate_response(response, checks=checks)
    return response


def known_ids(world: World, label: str) -> list[dict[str, int]]:
    """Real path ids for ``label``: the caller's own objects and another client's."""
    a, b = world.client_a, world.client_b
    return {
        "POST /sessions/{pk}/end/": [
            {"pk": world.open_a.pk},
            {"pk": world.session_a.pk},
            {"pk": world.session_b.pk},
        ],
        "POST /memory/{pk}/correct/": [{"pk": world.memory_a.pk}, {"pk": world.memory_b.pk}],
        "POST /clinician/clients/{client_id}/memory/{item_id}/correct/": [
            {"client_id": a.pk, "item_id": world.memory_a.pk},
            {"client_id": b.pk, "item_id": world.memory_b.pk},
            {"client_id": a.pk, "item_id": world.memory_b.pk},
        ],
    }.get(label, [])


def takes_input(label: str) -> bool:
    operation = OPERATIONS[label]
    return bool(list(operation.iter_parameters())) or bool(operation.body)


def strategy(world: World, label: str) -> st.SearchStrategy[Any]:
    operation = OPERATIONS[label]
    modes = [GenerationMode.POSITIVE]
    if takes_input(label):
        modes.append(GenerationMode.NEGATIVE)
    options = []
    for mode in modes:
        options.append(operation.as_strategy(generation_mode=mode))
        options.extend(
            operation.as_strategy(generation_mode=mode, path_parameters=ids)
            for ids in known_ids(world, label)
        )
    return st.one_of(options)


# -- 1. the document and the site agree ----------------------------------------------------
def test_it_documents_only_paths_that_resolve() -> None:
    assert SCHEMA.raw_schema["openapi"].startswith("3.")
    for path in SCHEMA.raw_schema["paths"]:
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        match = resolve(concrete)  # raises Resolver404 for a path the site does not have
        assert match.func is not None, path


@pytest.mark.parametrize(
    "label",
    [label for label, op in sorted(OPERATIONS.items()) if "405" in op.responses.status_codes],
)
def test_it_answers_an_undocumented_method_with_405(
    world: World, app: WSGIHandler, server_errors: list[BaseException], label: str
) -> None:
    """The 405s the document promises, for the role the URL is meant for."""
    operation = OPERATIONS[label]
    documented = {op.method.upper() for op in OPERATIONS.values() if op.path == operation.path}
    method = next(m for m in ("PUT", "DELETE", "PATCH", "GET") if m not in documented)
    user = world.users["clinician_a" if "/clinician/" in label else "client_a"]
    ids = (known_ids(world, label) or [{}])[0]
    case = operation.Case(method=method, path_parameters=ids)  # type: ignore[arg-type]
    response = case.call(app=app, **browser(user))
    assert not server_errors
    assert response.status_code == 405, (method, label)
    assert set(response.headers["allow"][0].split(", ")) <= documented | {"HEAD"}


def test_it_serves_the_export_as_documented(
    world: World, app: WSGIHandler, server_errors: list[BaseException]
) -> None:
    ClientControl.objects.create(
        client=world.client_a, ai_paused=True, pinned_skill="", excluded_skills=["c1"]
    )
    operation = OPERATIONS["GET /me/data/download.json"]
    send(operation.Case(), app, world.client_a, server_errors)
    # The second download lists the first one in the access log.
    response = send(operation.Case(), app, world.client_a, server_errors)
    assert response.status_code == 200
    document = response.json()
    # The world's rich parts are there, so the schema of each was exercised.
    assert document["sessions"] and document["sessions"][0]["turns"]
    assert any(t["decision"] and t["candidates"] for s in document["sessions"] for t in s["turns"])
    assert document["memory"] and document["posterior"][0]["updates"]
    assert document["safety_flags"] and document["controls"]["excluded_skills"] == ["c1"]
    assert document["profile"]["consents"] and document["access_log"]


@pytest.mark.parametrize("role", ["anonymous", "clinician_a", "admin"])
def test_it_refuses_the_export_to_others_as_documented(
    world: World, app: WSGIHandler, server_errors: list[BaseException], role: str
) -> None:
    operation = OPERATIONS["GET /me/data/download.json"]
    response = send(operation.Case(), app, world.users[role], server_errors)
    assert response.status_code == (302 if role == "anonymous" else 403)
    assert b"canary" not in response.content


@pytest.mark.django_db
def test_it_reports_a_dead_dependency_as_documented(
    settings: Any, app: WSGIHandler, server_errors: list[BaseException]
) -> None:
    # A real refused connection (nothing listens on port 1), not a stand-in.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.HEALTHZ_TIMEOUT_SECONDS = 0.5
    response = send(OPERATIONS[HEALTHZ].Case(), app, None, server_errors)
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis", "celery"]
    assert body["checks"]["database"] == {"status": "ok"}
    assert body["checks"]["celery"]["status"] == "unknown"


# -- 2. schemathesis over every operation --------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_it_answers_every_generated_request_as_documented(
    world: World,
    app: WSGIHandler,
    server_errors: list[BaseException],
    settings: Any,
    broken_engine: None,
    label: str,
    role: str,
) -> None:
    """``broken_engine``: ending a session runs the learning step, whose model calls then
    fail at once and fall back (neutral outcomes, no recap) instead of loading a model."""
    # No worker runs here: a short ping timeout keeps /healthz (503) fast.
    settings.HEALTHZ_TIMEOUT_SECONDS = 0.2
    user = world.users[role]

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy(world, label), label="case")
        GENERATED[label] += 1
        send(case, app, user, server_errors)

    try:
        run()
    finally:
        if label == "POST /login/":
            from axes.utils import reset

            reset()
    if label == "POST /login/" and user is None:
        case = OPERATIONS[label].Case(body={"username": "client_a", "password": PASSWORD})
        response = send(case, app, None, server_errors)
        assert response.status_code == 302, response.headers
        cookies = response.headers.get("set-cookie", [])
        assert any(c.strip().startswith("sessionid=") for c in cookies)


# Regressions schemathesis found (each was a 500).
@pytest.mark.django_db
def test_it_answers_an_overlong_username_with_the_form(
    app: WSGIHandler, server_errors: list[BaseException]
) -> None:
    """django-axes failed to store a username over 255 characters (varchar(255))."""
    case = OPERATIONS["POST /login/"].Case(
        body={"username": "0" * 300, "password": "0"},
        media_type="application/x-www-form-urlencoded",
    )
    response = send(case, app, None, server_errors)
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("next_", ["/login/", "/login/?a=1", "/%6Cogin/"])
def test_it_sends_a_logged_in_user_home_instead_of_back_to_the_login_page(
    world: World, app: WSGIHandler, server_errors: list[BaseException], method: str, next_: str
) -> None:
    """Django's LoginView raised ValueError ("Redirection loop") on ?next=/login/."""
    form: dict[str, Any] = {}
    if method == "POST":
        form = {
            "body": {"username": "x", "password": "y"},
            "media_type": "application/x-www-form-urlencoded",
        }
    case = OPERATIONS[f"{method} /login/"].Case(query={"next": next_}, **form)
    response = send(case, app, world.client_a, server_errors)
    assert response.status_code == 302
    assert response.headers["location"] == ["/"]


@pytest.mark.parametrize(
    "label",
    [label for label in sorted(OPERATIONS) if label.startswith("POST ")],
)
def test_it_refuses_posts_without_a_csrf_token(
    world: World, app: WSGIHandler, server_errors: list[BaseException], label: str
) -> None:
    user = None if label == "POST /login/" else world.client_a
    operation = OPERATIONS[label]
    ids = (known_ids(world, label) or [{}])[0]
    form: dict[str, Any] = {}
    if operation.body:
        form = {"media_type": "application/x-www-form-urlencoded", "body": {}}
    case = operation.Case(path_parameters=ids, **form)
    response = case.call(app=app, **browser(user, csrf=False))
    assert response.status_code == 403, label
    case.validate_response(response, checks=CHECKS)
