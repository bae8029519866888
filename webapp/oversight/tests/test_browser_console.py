"""The consoles in a real browser: headless system Chromium (Playwright) against Daphne
started here, on the PostgreSQL test database and Redis, with the tiny in-code model.

A clinician answers a live crisis alert, reads the flagged session with its preference
graph, excludes skills and sees the next session honour it, then approves a pending
adapter. An admin sees the posterior heatmap change after a client's session.

The server runs in another process: every row it must see is committed first
(``transaction=True``), and passwords are hashed with the server's own hasher.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.hashers import Argon2PasswordHasher
from django.db import connections

from webapp.accounts.models import User
from webapp.accounts.tests.factories import (
    PASSWORD,
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
    grant_all_consents,
)
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    run_daphne,
    server_env,
)
from webapp.learning.models import AdapterVersion
from webapp.learning.tests.helpers import make_version, write_adapter_files
from webapp.oversight.models import ClientControl

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no system Chromium at {CHROMIUM}"),
    pytest.mark.timeout(600),
]

WAIT_MS = 90_000
WS_OPEN_PROBE = """
document.addEventListener("htmx:wsOpen", function () {
  window.__wsOpen = (window.__wsOpen || 0) + 1;
});
"""
KEPT = "CBT6"
EXCLUDED = ["CBT1", "CBT2", "CBT3", "CBT4", "CBT5"]


def with_server_password(user: User) -> User:
    hasher = Argon2PasswordHasher()  # the live server's first hasher
    user.password = hasher.encode(PASSWORD, hasher.salt())
    user.save(update_fields=["password"])
    return user


def people() -> tuple[User, User]:
    clinician = with_server_password(ClinicianFactory())
    profile = ClientProfileFactory(modality="cbt", clinician=clinician)
    grant_all_consents(profile)
    return clinician, with_server_password(profile.user)


@pytest.fixture
def allow_sync_orm(monkeypatch):  # type: ignore[no-untyped-def]
    # Playwright's sync API leaves its event loop registered on this thread; the ORM calls
    # between page actions are ordinary blocking calls (Django's documented escape hatch).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def browser(allow_sync_orm):  # type: ignore[no-untyped-def]
    """A headless system Chromium. Each person gets their own context (cookie jar):
    ``browser.new_context()``, set up by :func:`person`."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)  # replies of the tiny model on a busy machine
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()
            # ORM calls made while Playwright's loop ran used a connection of their own
            # context; close it here, or the test database cannot be dropped at the end.
            connections.close_all()


def person(browser: Any) -> Any:
    """A page in a fresh browser context: its own cookies, so its own login."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    context.add_init_script(WS_OPEN_PROBE)
    return context.new_page()


@pytest.fixture
def server(transactional_db, tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    env = server_env(str(tiny_model_dir), max_new_tokens=8, candidates=3)
    with run_daphne(env, tmp_path / "daphne-console.log") as live:
        yield live
        print(f"--- daphne log (tail) ---\n{live.log_tail()}")  # shown if the test fails


@pytest.fixture
def artifacts(tmp_path) -> Path:  # type: ignore[no-untyped-def]
    path = Path(os.environ.get("PSYEVO_BROWSER_ARTIFACTS") or tmp_path / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- page steps ------------------------------------------------------------------------------
def log_in(page: Any, base: str, username: str, heading: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()


def chat(page: Any, base: str, texts: list[str]) -> int:
    """Start (or resume) a session as the client, send each text and wait for each reply;
    then end the session without a rating. Returns the session id."""
    from playwright.sync_api import expect

    page.goto(f"{base}/sessions/")
    page.get_by_role("button", name="Start session").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    session_id = int(re.search(r"/sessions/(\d+)/$", page.url).group(1))  # type: ignore[union-attr]
    page.wait_for_function("() => (window.__wsOpen || 0) > 0", timeout=WAIT_MS)
    for n, text in enumerate(texts, start=1):
        page.get_by_label("Message").fill(text)
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#transcript .turn-counselor")).to_have_count(n)
    page.get_by_text("End session", exact=True).click()
    page.get_by_role("button", name="End without rating").click()
    page.wait_for_url(re.compile(r"/sessions/$"))
    return session_id


# -- tests -------------------------------------------------------------------------------------
def test_a_clinician_answers_an_alert_reads_the_graph_excludes_skills_and_approves(
    server, browser, artifacts, tmp_path
):  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    clinician, client_user = people()
    pending = make_version(
        "v-pending", "pending_approval", write_adapter_files(tmp_path / "v-pending")
    )

    desk = person(browser)
    log_in(desk, server.url, clinician.username, "My clients")
    desk.wait_for_function("() => (window.__wsOpen || 0) > 0", timeout=WAIT_MS)

    # 1. The client writes something alarming, then goes on talking.
    talk = person(browser)
    log_in(talk, server.url, client_user.username, "My sessions")
    first = chat(talk, server.url, ["I want to kill myself", "I feel anxious about work"])

    # 2. The alert reaches the open dashboard live; the clinician opens the session.
    alert = desk.locator("#alerts .flag-crisis")
    expect(alert).to_be_visible()
    alert.get_by_role("link", name="Review the session").click()
    expect(desk.get_by_role("heading", name=re.compile(r"session 1"))).to_be_visible()
    graph = desk.locator("svg.soca-graph").first
    expect(graph).to_be_visible()
    expect(graph.locator("g.node.delivered")).to_have_count(1)
    expect(desk.get_by_text("Skill posterior at decision time").first).to_be_visible()
    desk.get_by_role("button", name="Acknowledge").click()
    expect(desk.get_by_text(re.compile(r"Acknowledged by"))).to_be_visible()
    desk.screenshot(path=str(artifacts / "clinician-session-review.png"), full_page=True)
    assert Turn.objects.filter(session_id=first, role="counselor").count() == 2

    # 3. Exclude five of the six CBT skills (htmx form, saved in place).
    desk.goto(f"{server.url}/clinician/clients/{client_user.pk}/")
    desk.get_by_role("link", name="Skill controls").first.click()
    for skill in EXCLUDED:
        desk.get_by_label(re.compile(rf"^{skill} ")).check()
    desk.get_by_role("button", name="Save skill controls").click()
    expect(desk.get_by_text("Saved. The next reply uses these controls.")).to_be_visible()
    control = ClientControl.objects.get(client=client_user)
    assert sorted(control.excluded_skills) == EXCLUDED

    # 4. The next session uses only the skill left.
    second = chat(talk, server.url, ["I still feel anxious", "Work keeps me up at night"])
    desk.goto(f"{server.url}/clinician/sessions/{second}/review/")
    expect(desk.locator("tr.chosen", has_text=f"{KEPT}").first).to_be_visible()
    expect(desk.get_by_text("excluded at the time")).to_have_count(2 * len(EXCLUDED))
    skills = set(
        Turn.objects.filter(session_id=second, role="counselor").values_list("skill", flat=True)
    )
    assert skills == {KEPT}

    # 5. Approve the pending adapter version on the approval page.
    desk.goto(f"{server.url}/adapters/{pending.pk}/")
    desk.get_by_role("button", name="Approve and activate for new sessions").click()
    expect(desk.get_by_text("is approved and active for new sessions")).to_be_visible()
    pending.refresh_from_db()
    assert pending.status == AdapterVersion.Status.ACTIVE and pending.approved_by == clinician


def test_an_admin_sees_the_heatmap_change_after_a_session(server, browser, artifacts):  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    _, client_user = people()
    admin = with_server_password(AdminFactory())
    talk = person(browser)
    log_in(talk, server.url, client_user.username, "My sessions")
    chat(talk, server.url, ["I feel anxious about work"])

    console = person(browser)
    log_in(console, server.url, admin.username, "Console")
    console.get_by_role("link", name="Clients: posterior inspector and erasure").click()
    console.get_by_role("link", name=f"Posteriors of {client_user.username}").click()
    heatmap = console.locator("#heatmap-after")
    expect(heatmap).to_be_visible()
    assert console.evaluate("() => document.getElementById('heatmap-after').naturalWidth") > 0
    before = heatmap.get_attribute("src")
    console.screenshot(path=str(artifacts / "admin-posteriors.png"), full_page=True)

    chat(talk, server.url, ["I cannot sleep before Mondays", "My boss shouts at me"])
    assert Session.objects.filter(client=client_user, status="ended").count() == 2
    console.reload()
    expect(console.locator("#after option[selected]")).to_have_text(re.compile(r"After session 2"))
    assert heatmap.get_attribute("src") != before
    console.screenshot(path=str(artifacts / "admin-posteriors-after.png"), full_page=True)
