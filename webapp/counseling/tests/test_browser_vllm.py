"""One client session in a real browser with the production engine: Daphne started here
with ``PSYEVO_BACKEND=vllm`` in graph mode (the paper's: N candidates, the judge, the
SOCA graph, the deepest delivered) against the real vLLM server of the vllm tests.

A run of the vllm tests skips nothing: without the system Chromium this test fails (the
default suite's browser tests, which a machine without Chromium may lack, still skip)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from counselor_engine.tests import vllm_server
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests import browser_support
from webapp.counseling.tests.browser_support import orm, run_daphne, server_env
from webapp.counseling.tests.test_browser import (  # the same page steps as the other tests
    browser,
    db_transcript,
    open_chat,
    page_transcript,
    send,
    visible_text,
)
from webapp.learning.models import CandidateGroup

__all__ = ["browser"]  # a fixture, used by name

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900),
]

TURN_WAIT_MS = 600_000  # a judged turn on 2 shared cores: ~20 s alone, minutes when busy


@pytest.fixture(scope="session", autouse=True)
def _chromium_present(request: pytest.FixtureRequest) -> None:
    """Session-scoped, so it runs before the (session-scoped) vLLM server fixture: a run
    that cannot drive a browser fails at once instead of starting a server first."""
    chromium = browser_support.CHROMIUM
    if chromium.exists():
        return
    if "vllm" in (request.config.getoption("markexpr", "") or ""):
        pytest.fail(
            f"no system Chromium at {chromium}: a run of the vllm tests skips nothing "
            "(bin/test installs it with apt-get install chromium)"
        )
    pytest.skip(f"no system Chromium at {chromium}")


@pytest.fixture
def vllm_daphne(transactional_db, vllm_url, tmp_path):  # type: ignore[no-untyped-def]
    env = {
        **server_env("/nonexistent", max_new_tokens=24, candidates=2),  # no local model
        "PSYEVO_BACKEND": "vllm",
        "PSYEVO_VLLM_URL": vllm_url,
        "PSYEVO_VLLM_MODEL": vllm_server.SERVED_NAME,
        "PSYEVO_MODE": "graph",
        "PSYEVO_BACKEND_TIMEOUT": "600",
    }
    with run_daphne(env, tmp_path / "daphne-vllm.log") as server:
        yield server
        print(f"--- daphne log (tail) ---\n{server.log_tail()}")  # shown if the test fails


def test_a_graph_mode_session_on_vllm_delivers_a_judged_reply(vllm_daphne, browser):  # type: ignore[no-untyped-def]
    page, session_id = open_chat(vllm_daphne.url, browser)
    assert orm(lambda: Session.objects.get(pk=session_id).mode) == "graph"

    send(page, "I feel anxious about work and I cannot sleep.")
    reply = page.locator("#transcript .turn-counselor .text")
    page.wait_for_function(
        "() => document.querySelectorAll('#transcript .turn-counselor').length > 0"
        " || !!document.querySelector('#status [role=alert]')",
        timeout=TURN_WAIT_MS,
    )
    alert = page.locator("#status [role=alert]")
    assert not alert.count(), f"the reply failed: {alert.first.text_content()}"
    expect(reply.last).not_to_be_empty()

    turn = orm(lambda: Turn.objects.filter(session_id=session_id, role="counselor").last())
    assert turn is not None and visible_text(reply.last.text_content() or "") == visible_text(
        turn.text
    )
    group = orm(lambda: CandidateGroup.objects.get(turn=turn))
    # The paper's path ran on vLLM: 2 candidates drafted, judged in both orders on every
    # criterion, and one of them delivered.
    assert group.mode == "graph" and len(group.candidates) == 2
    assert group.candidates[group.delivered] == turn.text
    assert group.judgments and group.pointwise and len(group.pointwise) == 2
    assert page_transcript(page) == db_transcript(session_id)
