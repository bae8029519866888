"""The output guard on the real turn path (issue 21): websocket -> consumer -> turn API
-> engine -> storage -> the clinician's review, on PostgreSQL and the Redis channel
layer. The model is a scripted fake backend (as in ``webapp/tests/test_injection.py``)
so the candidates are known: the guard, not chance, must decide what the client sees."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse

from counselor_engine import output_guard
from counselor_engine.tests.fakes import FakeBackend
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import runtime, services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until, token_texts, turn_texts
from webapp.learning.models import CandidateGroup

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
DONE = r'class="turn turn-counselor"'
CREDENTIAL = "As a licensed therapist, I can tell you this is very common."
DOSING = "Try 50 mg of sertraline before bed."
GOOD = "That sounds like a heavy week. What was the hardest moment?"


@pytest.fixture
def fake(settings, monkeypatch) -> FakeBackend:  # type: ignore[no-untyped-def]
    from counselor_engine import embeddings

    monkeypatch.setattr(embeddings, "_DEFAULT", embeddings.HashingEmbedder())
    backend = FakeBackend()
    settings.PSYEVO_CANDIDATES = 3
    settings.PSYEVO_MODEL_PROCESS = False
    monkeypatch.setattr(runtime, "_backend", runtime.LazyBackend(lambda: backend))
    return backend


def _client() -> tuple[Any, Any]:
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


async def _chat(text: str) -> tuple[Any, Any, list[str]]:
    profile, session = await sync_to_async(_client)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    try:
        await comm.send_to(
            text_data=json.dumps({"type": "message", "text": text, "client_msg_id": "m1"})
        )
        frames = await frames_until(comm, DONE)
    finally:
        await comm.disconnect()
    return profile, session, frames


def _stored(session: Any) -> tuple[Turn, CandidateGroup]:
    turn = Turn.objects.get(session=session, role="counselor")
    return turn, CandidateGroup.objects.get(turn=turn)


def _review(profile: Any, session: Any) -> str:
    browser = Client()
    browser.force_login(profile.clinician)
    page = browser.get(reverse("session_review", args=[session.pk])).content.decode()
    return unescape(re.sub(r"<[^>]+>", "", page))  # the words a clinician reads


async def test_the_client_never_sees_a_rejected_candidate_and_the_clinician_sees_why(fake):  # type: ignore[no-untyped-def]
    fake.script_texts(CREDENTIAL, GOOD, DOSING)
    profile, session, frames = await _chat("I had an awful week.")
    shown = " ".join(frames)
    assert turn_texts(frames, "counselor") == [GOOD]
    assert "licensed therapist" not in shown and "sertraline" not in shown
    turn, group = await sync_to_async(_stored)(session)
    assert turn.text == GOOD and group.delivered == 1
    assert [v["rules"] for v in group.guard] == [
        ["identity.credential"], [], ["advice.medication"]
    ]  # fmt: skip
    assert all(e["winner"] == 1 for e in group.edges), "a rejected candidate is never preferred"
    page = await sync_to_async(_review)(profile, session)
    assert "C2 (delivered)" in page
    assert "Rejected: " + output_guard.RULES["identity.credential"] in page
    assert "Rejected: " + output_guard.RULES["advice.medication"] in page
    assert CREDENTIAL in page, "the clinician reads the rejected text itself"


async def test_when_every_candidate_is_rejected_the_client_gets_the_fallback(fake):  # type: ignore[no-untyped-def]
    fake.script_texts(CREDENTIAL, DOSING, "I'm a real person, not a bot.")
    profile, session, frames = await _chat("Can you help me sleep?")
    assert turn_texts(frames, "counselor") == [output_guard.FALLBACK]
    turn, group = await sync_to_async(_stored)(session)
    assert turn.text == output_guard.FALLBACK
    assert group.delivered is None and not group.admissible and group.edges == []
    assert group.buffer_status == CandidateGroup.Buffer.EXCLUDED
    assert group.problem == "output guard rejected every candidate"
    page = await sync_to_async(_review)(profile, session)
    assert "No candidate was delivered" in page and page.count("Rejected: ") == 3


async def test_stream_first_sends_only_checked_sentences_over_the_socket(fake, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_MODE = "stream_first"
    fake.script_texts("That sounds hard. I'm a human too, so I get it. Tell me more.", GOOD, GOOD)
    _, session, frames = await _chat("Nobody understands me.")
    tokens = token_texts(frames)
    assert tokens and all("human" not in t for t in tokens)
    expected = "That sounds hard. " + output_guard.FALLBACK
    assert turn_texts(frames, "counselor") == [expected]
    turn, group = await sync_to_async(_stored)(session)
    assert turn.text == expected and group.delivered is None
    assert group.guard[0]["rules"] == ["identity.human"] and group.mode == "stream_first"
