"""A client in a real browser: headless system Chromium (Playwright) against Daphne started
here, on the real PostgreSQL test database and Redis, with the tiny in-code model.

The server runs in another process, so every row it must see is committed first
(``transaction=True``) and the client's password is hashed with the server's own
hasher (the tests' fast MD5 hasher is not configured there).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.hashers import Argon2PasswordHasher
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright

from webapp.accounts.models import ClientProfile
from webapp.accounts.tests.factories import PASSWORD, ClientProfileFactory, grant_all_consents
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.browser_support import (
    CHROMIUM,
    chromium,
    orm,
    run_daphne,
    server_env,
)
from webapp.oversight.models import SafetyFlag

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no system Chromium at {CHROMIUM}"),
    pytest.mark.timeout(300),
]

AI_NOTICE = "You are talking with an AI counselor"
WAIT_MS = 60_000

# The pages run under the app's CSP (no 'unsafe-eval'): whatever the tests evaluate in a
# page is a function, which Playwright calls without eval (a string expression would be
# refused).

# Installed before any page script: counts socket opens and closes, so a test can wait
# for the chat socket before it sends (and again after a reload).
WS_OPEN_PROBE = """
document.addEventListener("htmx:wsOpen", function () {
  window.__wsOpen = (window.__wsOpen || 0) + 1;
});
document.addEventListener("htmx:wsClose", function () {
  window.__wsClose = (window.__wsClose || 0) + 1;
});
"""

# Records every distinct text of #pending-text while a reply is written, and how many
# states there were when the reply's final turn landed in #transcript. A MutationObserver
# callback runs after each websocket message is handled, so no state can slip between polls.
RECORD_STREAM = """
() => {
  const turns = () => document.querySelectorAll("#transcript .turn-counselor").length;
  const baseline = turns();
  window.__states = [];
  window.__statesAtDone = null;
  const note = () => {
    const el = document.getElementById("pending-text");
    const text = el ? el.textContent : "";
    const states = window.__states;
    if (text && states[states.length - 1] !== text) { states.push(text); }
    if (window.__statesAtDone === null && turns() > baseline) {
      window.__statesAtDone = states.length;
      observer.disconnect();
    }
  };
  const observer = new MutationObserver(note);
  observer.observe(document.getElementById("main"),
                   { subtree: true, childList: true, characterData: true });
}
"""


def visible_text(text: str) -> str:
    """Text as comparable across the page and the database: model output may hold
    newlines (rendered as <br>), control bytes and NULs (dropped or replaced by the
    HTML parser), so compare printable, non-space characters only."""
    return "".join(c for c in text if c.isprintable() and not c.isspace() and c != "\ufffd")


def word_pieces(text: str) -> int:
    """How many pieces the engine streams this reply in (it splits after whitespace)."""
    return len(re.findall(r"\S*\s+|\S+$", text))


def make_client() -> ClientProfile:
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    hasher = Argon2PasswordHasher()  # the live server's first hasher
    profile.user.password = hasher.encode(PASSWORD, hasher.salt())
    profile.user.save(update_fields=["password"])
    return profile


@pytest.fixture
def browser() -> Iterator[BrowserContext]:
    with sync_playwright() as playwright, chromium(playwright) as context:
        context.set_default_timeout(WAIT_MS)
        context.add_init_script(WS_OPEN_PROBE)
        yield context


@pytest.fixture
def tiny_server(transactional_db, tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    """Daphne serving the tiny model; ~24 new tokens, so a reply streams in many pieces."""
    with run_daphne(server_env(str(tiny_model_dir)), tmp_path / "daphne-tiny.log") as server:
        yield server
        print(f"--- daphne log (tail) ---\n{server.log_tail()}")  # shown if the test fails


@pytest.fixture
def broken_server(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    """Daphne whose model cannot load: every model call fails."""
    with run_daphne(server_env("/nonexistent"), tmp_path / "daphne-broken.log") as server:
        yield server
        print(f"--- daphne log (tail) ---\n{server.log_tail()}")


@pytest.fixture
def artifacts(tmp_path) -> Path:  # type: ignore[no-untyped-def]
    """Where screenshots go: $PSYEVO_BROWSER_ARTIFACTS when set (to keep them), else tmp."""
    path = Path(os.environ.get("PSYEVO_BROWSER_ARTIFACTS") or tmp_path / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- page steps ----------------------------------------------------------------------------
def log_in(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="My sessions")).to_be_visible()


def start_session(page: Page) -> int:
    page.get_by_role("button", name="Start session").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    expect(page.get_by_text(AI_NOTICE)).to_be_visible()
    wait_for_socket(page)
    return int(re.search(r"/sessions/(\d+)/$", page.url).group(1))  # type: ignore[union-attr]


def open_chat(server_url: str, browser: BrowserContext) -> tuple[Page, int]:
    """A new consenting client, logged in, on the chat page of a new session (its id)."""
    profile = orm(make_client)
    page = browser.new_page()
    log_in(page, server_url, profile.user.username)
    return page, start_session(page)


def wait_for_socket(page: Page) -> None:
    page.wait_for_function("() => (window.__wsOpen || 0) > 0", timeout=WAIT_MS)


def send(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_role("button", name="Send").click()


def send_and_record(page: Page, text: str) -> tuple[list[str], int, str]:
    """Send ``text``; return the states #pending-text went through, how many of them came
    before the final turn landed, and that final counselor turn's text."""
    page.evaluate(RECORD_STREAM)
    send(page, text)
    page.wait_for_function(
        "() => window.__statesAtDone !== null || !!document.querySelector('#status [role=alert]')",
        timeout=WAIT_MS,
    )
    alert = page.locator("#status [role=alert]")
    if alert.count():
        code = alert.first.get_attribute("data-code")
        raise AssertionError(f"the reply failed: {code}: {alert.first.text_content()}")
    states: list[str] = page.evaluate("() => window.__states")
    at_done: int = page.evaluate("() => window.__statesAtDone")
    final = page.locator("#transcript .turn-counselor .text").last.text_content() or ""
    return states, at_done, final


def page_transcript(page: Page) -> list[tuple[str, str]]:
    rows = page.eval_on_selector_all(
        "#transcript article.turn",
        "els => els.map(el => [el.className, el.querySelector('.text').textContent])",
    )
    return [(re.search(r"turn-(\w+)", cls).group(1), visible_text(txt)) for cls, txt in rows]  # type: ignore[union-attr]


def db_transcript(session_id: int) -> list[tuple[str, str]]:
    turns = orm(lambda: list(Turn.objects.filter(session_id=session_id).order_by("seq")))
    return [(t.role, visible_text(t.text)) for t in turns]


# -- tests -------------------------------------------------------------------------------------
def test_a_client_chats_sees_the_reply_stream_reloads_and_ends_with_a_rating(
    tiny_server, browser, artifacts
):  # type: ignore[no-untyped-def]
    page, session_id = open_chat(tiny_server.url, browser)

    # 1. The reply grows in place before it lands in the transcript. A reply of one or two
    # words cannot show two intermediate states (the engine streams word pieces), so with
    # the random tiny model we may need another message; every reply must still only grow.
    messages = ["I feel anxious about work", "I cannot sleep before exams", "My friend is upset"]
    proven = False
    for text in messages:
        states, at_done, final = send_and_record(page, text)
        expect(page.locator("#transcript .turn-client .text").last).to_have_text(text)
        before = [visible_text(s) for s in states[:at_done]]
        target = visible_text(final)
        assert target and before, f"no streamed state before the final turn: {states!r}"
        assert all(target.startswith(s) for s in before), f"text did not only grow: {states!r}"
        assert all(len(a) <= len(b) for a, b in itertools.pairwise(before))
        intermediate = [s for s in dict.fromkeys(before) if s and s != target]
        stored = orm(
            lambda: (
                Turn.objects.filter(session_id=session_id, role="counselor").order_by("seq").last()
            )
        )
        assert stored is not None and visible_text(stored.text) == target
        if word_pieces(stored.text) >= 3:
            assert len(intermediate) >= 2, f"reply did not stream: {states!r}"
            proven = True
            break
    assert proven, "three replies in a row were under three words long"

    # 2. A reload mid-session shows the whole transcript, each turn once.
    page.reload()
    expect(page.get_by_text(AI_NOTICE)).to_be_visible()
    wait_for_socket(page)
    page.wait_for_timeout(300)  # let the resync answer arrive (it must add nothing)
    expected = db_transcript(session_id)
    assert len(expected) >= 2
    assert page_transcript(page) == expected

    # 3. The socket still works after the reload.
    send_and_record(page, "Thank you, that helps a little")
    assert page_transcript(page) == db_transcript(session_id)

    # Screenshots mid-session, desktop and phone width.
    page.screenshot(path=str(artifacts / "chat-desktop.png"), full_page=True)
    phone = browser.new_page()
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(page.url)
    expect(phone.get_by_text(AI_NOTICE)).to_be_visible()
    phone.screenshot(path=str(artifacts / "chat-phone.png"), full_page=True)
    phone.close()

    # 4. End the session with a rating.
    page.get_by_text("End session", exact=True).click()
    page.get_by_label("How well did you feel heard, understood and respected?").fill("8")
    page.get_by_label("Did we work on and talk about what you wanted to?").fill("7.5")
    page.get_by_label("Was the counselor's approach a good fit for you?").fill("9")
    page.get_by_label("Overall, how was today's session for you?").fill("8.5")
    page.screenshot(path=str(artifacts / "chat-end-form.png"), full_page=True)
    page.get_by_role("button", name="End session and send rating").click()
    page.wait_for_url(re.compile(r"/sessions/$"))
    expect(page.get_by_role("heading", name="My sessions")).to_be_visible()
    expect(page.get_by_text("Thank you. Your session is saved.")).to_be_visible()
    row = page.locator("tbody tr").filter(has_text="1 of")
    expect(row).to_contain_text("8.5 / 10")
    expect(row).not_to_contain_text("in progress")
    expect(row.get_by_role("link", name="Read")).to_be_visible()

    session = orm(lambda: Session.objects.get(pk=session_id))
    assert session.status == Session.Status.ENDED and session.ended_at is not None
    assert session.rated
    assert session.rating == {
        "relationship": 8.0,
        "goals_and_topics": 7.5,
        "approach": 9.0,
        "overall": 8.5,
    }


def test_a_crisis_message_gets_the_hotline_with_the_model_down(broken_server, browser):  # type: ignore[no-untyped-def]
    profile = orm(make_client)
    page = browser.new_page()
    log_in(page, broken_server.url, profile.user.username)
    session_id = start_session(page)
    expect(page.get_by_text(AI_NOTICE)).to_be_visible()

    send(page, "I want to kill myself")
    reply = page.locator("#transcript .turn-counselor .text").last
    expect(reply).to_contain_text("988", timeout=10_000)
    expect(page.locator("#transcript .turn-client .text").last).to_have_text(
        "I want to kill myself"
    )
    expect(page.locator("#status [role=alert]")).to_have_count(0)

    flag = orm(lambda: SafetyFlag.objects.select_related("turn").get(session_id=session_id))
    assert flag.level == "crisis"
    assert flag.turn.text == "I want to kill myself"

    # The model really is down: an ordinary message gets an error and a retry, not a reply
    # (after the server has tried to start its model process, which takes a few seconds).
    send(page, "Thank you")
    expect(page.locator("#status [role=alert]")).to_contain_text("not responding", timeout=60_000)
    expect(page.get_by_role("button", name="Try again")).to_be_visible()
    expect(page.locator("#transcript .turn-counselor")).to_have_count(1)


def test_an_idle_chat_socket_stays_open(broken_server, browser):  # type: ignore[no-untyped-def]
    """redis-py reads with a 5 s timeout by default, as long as the channel layer's blocking
    receive: without a longer socket_timeout an idle consumer died with 1011."""
    # Any server will do (this one starts fastest: it never loads a model).
    profile = orm(make_client)
    page = browser.new_page()
    log_in(page, broken_server.url, profile.user.username)
    start_session(page)
    page.wait_for_timeout(8_000)  # longer than the 5 s blocking read of the channel layer
    assert page.evaluate("() => [window.__wsOpen || 0, window.__wsClose || 0]") == [1, 0]


# -- typed text is never discarded -------------------------------------------------------------
def client_turns(session_id: int, text: str) -> int:
    """How many client turns of the session say ``text`` (text is encrypted at rest, so
    the rows are compared here, not in SQL)."""
    turns = orm(lambda: list(Turn.objects.filter(session_id=session_id, role="client")))
    return sum(turn.text == text for turn in turns)


def test_typed_text_survives_a_reload_and_a_server_crash_and_is_stored_once(tiny_server, browser):  # type: ignore[no-untyped-def]
    page, session_id = open_chat(tiny_server.url, browser)
    box = page.get_by_label("Message")

    # A draft survives a reload.
    box.fill("half a thought")
    page.reload()
    page.wait_for_function("() => (window.__wsOpen || 0) > 0", timeout=WAIT_MS)
    expect(box).to_have_value("half a thought")

    # The server crashes (no close frame); a message sent meanwhile stays in the box.
    tiny_server.crash()
    page.wait_for_function("() => (window.__wsClose || 0) > 0", timeout=WAIT_MS)
    expect(page.locator("#connection")).to_contain_text("connection was lost")
    text = "I could not sleep again last night"
    box.fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    expect(box).to_have_value(text)
    expect(page.locator("#connection")).to_contain_text("kept in the box")
    assert client_turns(session_id, text) == 0

    # It comes back: the page reconnects, the message goes out once, the reply follows.
    tiny_server.start()
    client_turn = page.locator("#transcript .turn-client .text").last
    expect(client_turn).to_have_text(text, timeout=WAIT_MS)
    expect(box).to_have_value("")
    expect(page.locator("#connection")).to_be_hidden()
    expect(page.locator("#transcript .turn-counselor")).to_have_count(1, timeout=WAIT_MS)
    assert client_turns(session_id, text) == 1


@pytest.fixture
def database_switch(transactional_db):  # type: ignore[no-untyped-def]
    """Turns the test database away from every new connection and cuts the live server's
    (PostgreSQL unreachable for the server), then lets them back in. The test process's
    own connection is spared: pytest-django needs it to clean up."""
    import psycopg
    from django.db import connection

    from webapp.counseling.tests.browser_support import database_url

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        keep = cursor.fetchone()[0]
    db = connection.settings_dict
    name = db["NAME"]
    admin = psycopg.connect(
        database_url({**db, "NAME": "postgres"}), autocommit=True, connect_timeout=10
    )

    class Switch:
        def down(self) -> None:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> %s",
                (name, keep),
            )

        def up(self) -> None:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    switch = Switch()
    try:
        yield switch
    finally:
        switch.up()
        admin.close()


def test_a_message_sent_while_storage_is_down_stays_in_the_box_and_is_stored_once(
    tiny_server, database_switch, browser
):  # type: ignore[no-untyped-def]
    """PostgreSQL refuses connections: the server holds the message (and says so), the
    page keeps the words in the box; storage back, the message is written once, the box
    empties and the counselor answers."""
    page, session_id = open_chat(tiny_server.url, browser)
    box = page.get_by_label("Message")
    text = "It has been a hard week at home"

    database_switch.down()
    box.fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#status [role=alert]")).to_contain_text(
        "saved as soon as storage is back", timeout=WAIT_MS
    )
    expect(box).to_have_value(text)  # not stored yet: the words stay with the person

    database_switch.up()
    expect(page.locator("#transcript .turn-client .text").last).to_have_text(text, timeout=WAIT_MS)
    expect(box).to_have_value("")
    expect(page.locator("#transcript .turn-counselor")).to_have_count(1, timeout=WAIT_MS)
    page.get_by_role("button", name="Send", exact=True).click()  # an empty box sends nothing
    assert client_turns(session_id, text) == 1


@pytest.fixture
def slow_server(transactional_db, tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    """Daphne whose judged replies take seconds (5 long candidates), as SmolLM2's take
    tens of seconds on a small CPU: time for a second tab to speak mid-reply."""
    env = server_env(str(tiny_model_dir), max_new_tokens=256, candidates=5)
    with run_daphne(env, tmp_path / "daphne-slow.log") as server:
        yield server
        print(f"--- daphne log (tail) ---\n{server.log_tail()}")


def test_a_crisis_from_a_second_tab_mid_reply_gets_the_safe_reply_in_both_tabs(
    slow_server, browser
):  # type: ignore[no-untyped-def]
    from webapp.oversight.models import AuditEvent

    tab1, session_id = open_chat(slow_server.url, browser)
    tab2 = browser.new_page()
    tab2.goto(tab1.url)
    wait_for_socket(tab2)
    send(tab1, "Work has been a lot lately")
    expect(tab2.locator("#status .busy")).to_be_visible()  # the reply is being written
    crisis = "honestly I am done, I have the pills counted out and I am taking them tonight"
    send(tab2, crisis)
    for tab in (tab2, tab1):
        expect(tab.locator("#transcript .turn-counselor .text").last).to_contain_text(
            "988", timeout=10_000
        )
        expect(tab.locator("#transcript .turn-client .text").last).to_have_text(crisis)
    expect(tab2.get_by_label("Message")).to_have_value("")
    tab1.wait_for_timeout(3_000)  # the superseded reply must not land after the safe one
    for tab in (tab1, tab2):
        expect(tab.locator("#transcript .turn-counselor")).to_have_count(1)
    flag = orm(lambda: SafetyFlag.objects.select_related("turn").get(session_id=session_id))
    assert flag.level == "crisis" and flag.turn.text == crisis
    roles = [role for role, _ in db_transcript(session_id)]
    assert roles == ["client", "client", "counselor"]  # the first message's reply withdrawn
    assert orm(lambda: AuditEvent.objects.filter(action="turn.superseded").count()) == 1
