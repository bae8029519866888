"""The chat socket end to end on the real stack: PostgreSQL, the Redis channel layer,
the tiny in-code model."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.sessions.models import Session as DjangoSession

from webapp.accounts.tests.factories import (
    ClientProfileFactory,
    ClinicianFactory,
    grant_all_consents,
)
from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until, token_texts, turn_texts
from webapp.counseling.turns import redis_client
from webapp.learning.models import CandidateGroup, SkillDecision
from webapp.oversight.models import AlertOutbox, SafetyFlag

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
DONE = r'class="turn turn-counselor"'


def _client(consents: bool = True):  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    if consents:
        grant_all_consents(profile)
    session = services.start_session(profile.user)
    return profile, session


@pytest.fixture
async def chat(tiny_engine):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    comm, connected, _, key = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    yield profile, session, comm, key
    await comm.disconnect()


def send(comm, **data):  # type: ignore[no-untyped-def]
    return comm.send_to(text_data=json.dumps(data))


async def test_it_streams_a_reply_and_commits_the_turn_with_its_evidence(chat):  # type: ignore[no-untyped-def]
    profile, session, comm, _ = chat
    await send(comm, type="message", text="I feel anxious about work", client_msg_id="m1")
    frames = await frames_until(comm, DONE)
    assert turn_texts(frames, "client") == ["I feel anxious about work"]
    tokens = token_texts(frames)
    assert len(tokens) >= 2, "the reply must arrive in pieces"
    reply = turn_texts(frames, "counselor")[0]
    assert "".join(tokens).strip() == reply
    turns = await sync_to_async(list)(Turn.objects.filter(session=session).order_by("seq"))
    assert [(t.seq, t.role) for t in turns] == [(0, "client"), (1, "counselor")]
    assert turns[1].text.strip() == reply and turns[1].skill.startswith(profile.modality.upper())
    decision = await sync_to_async(SkillDecision.objects.get)(turn=turns[1])
    assert abs(sum(r["probability"] for r in decision.records.values()) - 1) < 1e-9
    group = await sync_to_async(CandidateGroup.objects.get)(turn=turns[1])
    assert len(group.candidates) == 3
    assert group.client_id == profile.user.pk and group.modality == profile.modality
    assert group.candidates[group.delivered].strip() == reply
    assert group.buffer_status in ("available", "excluded")


PROGRESS = re.compile(r'data-stage="(\w+)" data-done="(\d+)" data-total="(\d+)"')


async def test_a_judged_reply_shows_the_engines_progress_in_every_tab_before_it_streams(chat):  # type: ignore[no-untyped-def]
    """Graph mode (3 candidates): drafts 0/3, 3/3, then comparisons 0..6 of 6, reaching the
    writing tab and a second tab alike, all before the first token of the reply."""
    profile, session, comm, _ = chat
    other, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await send(comm, type="message", text="I keep worrying about money", client_msg_id="m1")
    for tab in (comm, other):
        frames = await frames_until(tab, DONE)
        steps = [
            (m.group(1), int(m.group(2)), int(m.group(3)))
            for f in frames
            if (m := PROGRESS.search(f))
        ]
        assert steps == [
            ("drafting", 0, 3), ("drafting", 3, 3),
            ("comparing", 0, 6), ("comparing", 2, 6), ("comparing", 4, 6), ("comparing", 6, 6),
        ]  # fmt: skip
        first_token = next(i for i, f in enumerate(frames) if 'id="pending-text" hx-swap-oob' in f)
        last_progress = max(i for i, f in enumerate(frames) if PROGRESS.search(f))
        assert last_progress < first_token
    await other.disconnect()


async def test_it_resyncs_a_reconnecting_page_without_loss_or_duplicates(chat):  # type: ignore[no-untyped-def]
    profile, session, comm, _ = chat
    await send(comm, type="message", text="hello there", client_msg_id="a1")
    await frames_until(comm, DONE)
    await comm.disconnect()
    comm2, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await send(comm2, type="resync", after_seq=0)
    frames = await frames_until(comm2, r'id="control"')
    assert turn_texts(frames, "client") == []
    assert len(turn_texts(frames, "counselor")) == 1
    # The page resends the message it never saw answered: stored once, answered once.
    await send(comm2, type="message", text="hello there", client_msg_id="a1")
    await asyncio.sleep(0.5)
    assert await sync_to_async(Turn.objects.filter(session=session).count)() == 2
    await comm2.disconnect()


async def test_a_second_tab_receives_the_same_stream(chat):  # type: ignore[no-untyped-def]
    profile, session, comm, _ = chat
    other, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await send(comm, type="message", text="is anyone there", client_msg_id="t1")
    mine = await frames_until(comm, DONE)
    theirs = await frames_until(other, DONE)
    assert turn_texts(mine, "counselor") == turn_texts(theirs, "counselor")
    await other.disconnect()


async def test_a_message_sent_as_the_previous_reply_ends_is_answered_not_refused(chat):  # type: ignore[no-untyped-def]
    """The page enables Send on the reply's final frame, a moment before the writer lets go
    of the session: a message sent in that moment waits for it instead of being refused."""
    _, session, comm, _ = chat
    key = f"psyevo:reply:{session.pk}"
    await redis_client().set(key, "previous-writer", ex=30)
    await send(comm, type="message", text="one more thing", client_msg_id="g1")
    await asyncio.sleep(0.3)
    await redis_client().delete(key)  # the previous reply's writer finishes
    frames = await frames_until(comm, DONE)
    assert not any('data-code="busy"' in f for f in frames)
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "counselor"]


async def test_a_message_sent_on_the_final_frame_of_a_reply_is_answered(chat):  # type: ignore[no-untyped-def]
    """The page enables Send when the reply's turn frame arrives: a message sent at once
    must be answered, never refused as busy (the writer may still be finishing up)."""
    _, session, comm, _ = chat
    await send(comm, type="message", text="first thing", client_msg_id="f1")
    await frames_until(comm, DONE)
    await send(comm, type="message", text="second thing", client_msg_id="f2")
    frames = await frames_until(comm, DONE)
    assert not any('data-code="busy"' in f for f in frames)
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "counselor", "client", "counselor"]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"type": "message", "text": "   "}, "empty_message"),
        ({"type": "message", "text": ""}, "empty_message"),
        ({"type": "message", "text": 42}, "not_text"),
        ({"type": "message", "text": "x" * 5000}, "too_long"),
        ({"type": "dance"}, "unknown_type"),
    ],
)
async def test_it_answers_bad_messages_with_an_error_frame_and_stores_nothing(chat, payload, code):  # type: ignore[no-untyped-def]
    _, session, comm, _ = chat
    await send(comm, **payload)
    frame = await comm.receive_from(timeout=10)
    assert f'data-code="{code}"' in frame
    assert await sync_to_async(Turn.objects.filter(session=session).count)() == 0


async def test_it_answers_malformed_json_with_an_error_frame(chat):  # type: ignore[no-untyped-def]
    _, _, comm, _ = chat
    await comm.send_to(text_data="{not json")
    assert 'data-code="bad_json"' in await comm.receive_from(timeout=10)


async def test_it_closes_with_1009_on_an_oversized_frame(chat):  # type: ignore[no-untyped-def]
    _, _, comm, _ = chat
    await comm.send_to(text_data=json.dumps({"type": "message", "text": "x" * 70_000}))
    assert await comm.receive_output(timeout=10) == {"type": "websocket.close", "code": 1009}


async def test_it_rate_limits_a_flood_then_closes_with_1008(chat, settings):  # type: ignore[no-untyped-def]
    _, _, comm, _ = chat
    for _ in range(settings.WS_RATE_LIMIT + 1):
        await send(comm, type="ping")
    outputs = []
    while True:
        out = await comm.receive_output(timeout=10)
        outputs.append(out)
        if out["type"] == "websocket.close":
            break
    assert outputs[-1]["code"] == 1008
    assert any('data-code="rate_limited"' in o.get("text", "") for o in outputs)


async def test_it_refuses_another_clients_session_and_logs_it(tiny_engine, caplog):  # type: ignore[no-untyped-def]
    _, session = await sync_to_async(_client)()
    intruder, _ = await sync_to_async(_client)()
    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        _, connected, code, _ = await connect(f"/ws/sessions/{session.pk}/", intruder.user)
    assert not connected and code == 4404
    assert any("denied socket" in r.getMessage() for r in caplog.records)


async def test_only_the_assigned_clinician_may_join(tiny_engine):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.clinician)
    assert connected
    await comm.disconnect()
    stranger = await sync_to_async(ClinicianFactory)()
    _, connected, code, _ = await connect(f"/ws/sessions/{session.pk}/", stranger)
    assert not connected and code == 4404


async def test_a_clinician_covering_an_escalated_flag_may_join_and_write(tiny_engine):  # type: ignore[no-untyped-def]
    from webapp.oversight.models import ClientControl

    profile, session = await sync_to_async(_client)()
    covering = await sync_to_async(ClinicianFactory)()
    _, connected, code, _ = await connect(f"/ws/sessions/{session.pk}/", covering)
    assert not connected and code == 4404  # no escalation yet: a stranger
    turn, _ = await sync_to_async(services.append_turn)(session.pk, "client", "goodbye for good")
    await sync_to_async(SafetyFlag.objects.create)(
        client=profile.user, session=session, turn=turn, level="crisis", escalated_to=covering
    )
    await sync_to_async(ClientControl.objects.create)(client=profile.user, ai_paused=True)
    client_sock, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    covering_sock, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", covering)
    assert connected
    await send(
        covering_sock, type="message", text="I'm covering for your clinician.", client_msg_id="e1"
    )
    frames = await frames_until(client_sock, r"turn-clinician")
    assert turn_texts(frames, "clinician") == ["I'm covering for your clinician."]
    author = await sync_to_async(
        lambda: Turn.objects.get(session=session, role="clinician").author_id
    )()
    assert author == covering.pk
    await client_sock.disconnect()
    await covering_sock.disconnect()


async def test_it_closes_the_socket_soon_after_logout(chat, settings):  # type: ignore[no-untyped-def]
    settings.WS_REAUTH_SECONDS = 0.2
    profile, session, _, _ = chat
    comm, connected, _, key = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await sync_to_async(DjangoSession.objects.filter(session_key=key).delete)()
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await comm.disconnect()  # as the server would report it: the consumer's tasks end


async def test_a_crisis_gets_the_safe_reply_and_alerts_the_clinician_with_the_model_down(
    broken_engine,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    watch, connected, _, _ = await connect("/ws/notifications/", profile.clinician)
    assert connected
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    loop = asyncio.get_running_loop()
    started = loop.time()
    await send(comm, type="message", text="I want to kill myself tonight", client_msg_id="c1")
    frames = await frames_until(comm, DONE, wait=10)
    assert loop.time() - started < 2.0
    assert "988" in turn_texts(frames, "counselor")[0]
    alert = await watch.receive_from(timeout=5)
    assert 'data-kind="safety_flag"' in alert and 'data-level="crisis"' in alert
    assert profile.user.username in alert
    flag = await sync_to_async(SafetyFlag.objects.get)(session=session)
    assert flag.level == "crisis"
    assert await sync_to_async(
        AlertOutbox.objects.filter(flag=flag, recipient=profile.clinician).exists
    )()
    await comm.disconnect()
    await watch.disconnect()


@pytest.mark.parametrize(
    ("text", "crisis"),
    [("I feel anxious about work", False), ("I want to kill myself tonight", True)],
)
async def test_each_message_is_assessed_for_safety_exactly_once(chat, monkeypatch, text, crisis):  # type: ignore[no-untyped-def]
    """Validation and ``safety.assess`` run once per message (issue 17), on the socket
    path: the turn API assesses it and hands that to ``Counselor.respond``, which must not
    assess it again (nor the consumer before it)."""
    from counselor_engine import safety

    _, session, comm, _ = chat
    assessed: list[str] = []
    real = safety.assess

    def spy(message: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        assessed.append(message)
        return real(message, *args, **kwargs)

    monkeypatch.setattr(safety, "assess", spy)
    await send(comm, type="message", text=text, client_msg_id="s1")
    frames = await frames_until(comm, DONE)
    reply = turn_texts(frames, "counselor")[0]
    assert ("988" in reply) is crisis
    assert assessed.count(text) == 1, assessed
    assert len(assessed) == 1, assessed  # nothing else of the turn assessed anything
    turns = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", "safety_level")
    )
    assert [role for role, _ in turns] == ["client", "counselor"]
    assert (turns[0][1] == "crisis") is crisis


async def test_a_backend_failure_keeps_the_message_and_a_retry_answers_it_once(
    broken_engine, settings, tiny_model_dir
):  # type: ignore[no-untyped-def]
    from webapp.counseling import runtime

    profile, session = await sync_to_async(_client)()
    comm, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    await send(comm, type="message", text="are you there", client_msg_id="r1")
    frames = await frames_until(comm, r'data-code="backend_error"', wait=30)
    assert 'name="type" value="retry"' in frames[-1]
    assert await sync_to_async(Turn.objects.filter(session=session).count)() == 1
    settings.PSYEVO_MODEL_PATH = str(tiny_model_dir)
    settings.PSYEVO_CANDIDATES = 2
    settings.PSYEVO_MAX_NEW_TOKENS = 8
    runtime.reset_backend()
    await send(comm, type="retry", client_msg_id="r1")
    await frames_until(comm, DONE)
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "counselor"]
    await comm.disconnect()


async def test_without_training_consent_evidence_never_enters_the_buffer(tiny_engine):  # type: ignore[no-untyped-def]
    from webapp.accounts.models import ConsentRecord

    profile, session = await sync_to_async(_client)()
    await sync_to_async(ConsentRecord.objects.create)(
        profile=profile, purpose="training", granted=False
    )
    comm, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    await send(comm, type="message", text="work has been hard", client_msg_id="n1")
    await frames_until(comm, DONE)
    group = await sync_to_async(CandidateGroup.objects.get)(session=session)
    assert group.buffer_status == "excluded"
    await comm.disconnect()


async def test_the_clinician_can_pause_the_ai_and_reply_directly(tiny_engine):  # type: ignore[no-untyped-def]
    from webapp.oversight.models import ClientControl

    profile, session = await sync_to_async(_client)()
    await sync_to_async(ClientControl.objects.create)(client=profile.user, ai_paused=True)
    client_sock, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    clinician_sock, _, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.clinician)
    await send(client_sock, type="message", text="can a person talk to me", client_msg_id="p1")
    frames = await frames_until(client_sock, r"paused the AI counselor")
    await send(clinician_sock, type="message", text="Hi, I'm here with you.", client_msg_id="k1")
    frames = await frames_until(client_sock, r"turn-clinician")
    assert turn_texts(frames, "clinician") == ["Hi, I'm here with you."]
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "clinician"]
    await client_sock.disconnect()
    await clinician_sock.disconnect()
    assert get_channel_layer() is not None
