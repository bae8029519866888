"""Starting, ending and rating sessions over HTTP, and what the session end persists."""

from __future__ import annotations

import json
import logging

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import services
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.helpers import connect, frames_until
from webapp.learning.models import LearningScope, PosteriorCell, PosteriorUpdate
from webapp.memory.models import MemoryItem

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
RATING = {"relationship": "8", "goals_and_topics": "7", "approach": "9", "overall": "8.5"}


def consenting_client():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory(modality="het")
    grant_all_consents(profile)
    return profile


CONSENT_REASON = "Before you can talk with the counselor, please agree to counseling"


def test_start_without_counseling_consent_takes_the_client_to_my_choices(client):  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    client.force_login(profile.user)
    response = client.post(reverse("start_session"), follow=True)
    assert response.redirect_chain[-1][0] == reverse("consent") + "?why=needs-counseling"
    assert CONSENT_REASON in response.content.decode()
    assert not Session.objects.filter(client=profile.user).exists()


def test_a_client_who_never_agreed_lands_on_my_choices_and_then_on_sessions(client):  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    client.force_login(profile.user)
    landed = client.get("/", follow=True)
    assert CONSENT_REASON in landed.content.decode()
    url = landed.redirect_chain[-1][0]
    after = client.post(url, {"counseling": "on"})
    assert after.status_code == 302 and after["Location"] == reverse("my_sessions")
    assert profile.has_consent("counseling") and not profile.has_consent("memory")
    assert client.post(reverse("start_session")).status_code == 302
    assert Session.objects.filter(client=profile.user).count() == 1


def test_saving_other_choices_without_counseling_stays_on_my_choices(client):  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    client.force_login(profile.user)
    url = reverse("consent") + "?why=needs-counseling"
    after = client.post(url, {"memory": "on"}, follow=True)
    assert after.redirect_chain[-1][0] == url and CONSENT_REASON in after.content.decode()
    assert not profile.has_consent("counseling")


def test_my_choices_opened_directly_gives_no_reason(client):  # type: ignore[no-untyped-def]
    client.force_login(consenting_client().user)
    assert CONSENT_REASON not in client.get(reverse("consent")).content.decode()
    assert client.get("/")["Location"] == reverse("my_sessions")


def test_a_client_who_withdrew_still_reads_past_sessions_but_cannot_start(client):  # type: ignore[no-untyped-def]
    profile = consenting_client()
    session = services.start_session(profile.user)
    Session.objects.filter(pk=session.pk).update(status="ended", ended_at=timezone.now())
    profile.consents.create(purpose="counseling", granted=False)
    client.force_login(profile.user)
    page = client.get(reverse("my_sessions")).content.decode()
    assert reverse("transcript", args=[session.pk]) in page
    assert "agree to counseling on My choices" in page and ">Start session</button>" not in page


def test_it_starts_and_resumes_one_session(client):  # type: ignore[no-untyped-def]
    profile = consenting_client()
    client.force_login(profile.user)
    first = client.post(reverse("start_session"))
    second = client.post(reverse("start_session"))
    assert first["Location"] == second["Location"]
    session = Session.objects.get(client=profile.user)
    assert session.index == 0 and session.status == "open" and session.adapter_version is None
    page = client.get(first["Location"]).content.decode()
    assert "You are talking with an AI counselor" in page
    assert '<label for="message">Message</label>' in page and ">Send</button>" in page
    assert f'ws-connect="/ws/sessions/{session.pk}/"' in page


def test_another_clients_session_is_404_and_logged(client, caplog):  # type: ignore[no-untyped-def]
    owner = consenting_client()
    session = services.start_session(owner.user)
    client.force_login(consenting_client().user)
    with caplog.at_level("WARNING", logger="psyevo.security"):
        assert client.get(reverse("chat", args=[session.pk])).status_code == 404
        assert client.post(reverse("end_session", args=[session.pk]), RATING).status_code == 404
    assert sum("not theirs" in r.getMessage() for r in caplog.records) == 2


async def talk(session: Session, user, texts: list[str]) -> None:  # type: ignore[no-untyped-def]
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", user)
    assert connected
    for i, text in enumerate(texts):
        await comm.send_to(
            text_data=json.dumps({"type": "message", "text": text, "client_msg_id": f"m{i}"})
        )
        await frames_until(comm, r'class="turn turn-counselor"')
    await comm.disconnect()


async def test_ending_with_a_rating_persists_credit_posteriors_memory_and_schedule(
    tiny_engine, async_client
):  # type: ignore[no-untyped-def]
    profile = await sync_to_async(consenting_client)()
    session = await sync_to_async(services.start_session)(profile.user)
    await talk(
        session,
        profile.user,
        ["I feel lonely since I moved", "I don't know anyone here", "Weekends are the worst"],
    )
    await sync_to_async(async_client.force_login)(profile.user)
    response = await async_client.post(reverse("end_session", args=[session.pk]), RATING)
    assert response.status_code == 302 and response["Location"] == reverse("my_sessions")
    await sync_to_async(session.refresh_from_db)()
    assert session.status == "ended" and session.rated
    assert session.rating == {
        "relationship": 8.0,
        "goals_and_topics": 7.0,
        "approach": 9.0,
        "overall": 8.5,
    }
    assert 0.0 <= session.session_reward <= 1.0
    assert len(session.outcome["credit"]) == 3
    assert session.outcome["evidence"]["skip"] == "" and session.outcome["evidence"]["judged"] == 2
    updates = await sync_to_async(list)(
        PosteriorUpdate.objects.filter(session=session).select_related("cell")
    )
    skills = await sync_to_async(list)(
        Turn.objects.filter(session=session, role="counselor")
        .order_by("seq")
        .values_list("state_slot", "skill")
    )
    # The last reply has no client reaction: not judged, so it updates no cell.
    assert session.outcome["credit"][2] is None
    assert {(u.cell.state_slot, u.cell.skill) for u in updates} == set(skills[:2])
    assert [u.credit for u in sorted(updates, key=lambda u: u.turn_id)] == pytest.approx(
        session.outcome["credit"][:2]
    )
    cells = await sync_to_async(PosteriorCell.objects.filter(client=profile.user).count)()
    assert cells == len(set(skills[:2]))
    recap = await sync_to_async(list)(
        MemoryItem.objects.filter(client=profile.user, source_session=session)
    )
    assert recap and all(m.origin == "counselor" for m in recap)
    scope = await sync_to_async(LearningScope.objects.get)(name="default")
    assert scope.completed_sessions == 1


async def test_without_memory_consent_the_session_end_drafts_no_recap(
    tiny_engine, async_client, monkeypatch
):  # type: ignore[no-untyped-def]
    """Withdrawn memory consent: the transcript is not shown to the model for a recap
    at all (nothing could be kept); given again, the next session end drafts one."""
    from counselor_engine import counselor as engine_counselor
    from webapp.accounts.models import ConsentRecord

    drafted: list[int] = []
    real = engine_counselor.generate_recap

    async def spy(backend, transcript, **kwargs):  # type: ignore[no-untyped-def]
        drafted.append(len(transcript))
        return await real(backend, transcript, **kwargs)

    monkeypatch.setattr(engine_counselor, "generate_recap", spy)
    profile = await sync_to_async(consenting_client)()
    await sync_to_async(ConsentRecord.objects.create)(
        profile=profile, purpose="memory", granted=False
    )
    await sync_to_async(async_client.force_login)(profile.user)
    withheld = await sync_to_async(services.start_session)(profile.user)
    await talk(withheld, profile.user, ["I had a rough week at work"])
    assert (
        await async_client.post(reverse("end_session", args=[withheld.pk]), RATING)
    ).status_code == 302

    assert drafted == []
    assert not await sync_to_async(MemoryItem.objects.filter(client=profile.user).exists)()

    await sync_to_async(ConsentRecord.objects.create)(
        profile=profile, purpose="memory", granted=True
    )
    given = await sync_to_async(services.start_session)(profile.user)
    await talk(given, profile.user, ["I had a rough week at work"])
    assert (
        await async_client.post(reverse("end_session", args=[given.pk]), RATING)
    ).status_code == 302
    assert drafted == [2]  # one client message and its reply
    assert await sync_to_async(MemoryItem.objects.filter(source_session=given).exists)()


async def test_ending_without_rating_is_recorded(tiny_engine, async_client):  # type: ignore[no-untyped-def]
    profile = await sync_to_async(consenting_client)()
    session = await sync_to_async(services.start_session)(profile.user)
    await talk(session, profile.user, ["hello"])
    await sync_to_async(async_client.force_login)(profile.user)
    response = await async_client.post(reverse("end_session", args=[session.pk]), {"skip": "on"})
    assert response.status_code == 302
    await sync_to_async(session.refresh_from_db)()
    assert session.status == "ended" and not session.rated and session.rating is None


def test_an_incomplete_rating_is_refused_and_the_session_stays_open(client):  # type: ignore[no-untyped-def]
    profile = consenting_client()
    session = services.start_session(profile.user)
    client.force_login(profile.user)
    response = client.post(reverse("end_session", args=[session.pk]), {"overall": "5"})
    assert response.status_code == 400
    assert "Rate all four items" in response.content.decode()
    session.refresh_from_db()
    assert session.status == "open"


def test_the_client_reads_and_corrects_memory_keeping_its_source(client):  # type: ignore[no-untyped-def]
    profile = consenting_client()
    session = services.start_session(profile.user)
    item = MemoryItem.objects.create(
        client=profile.user,
        kind="fact",
        text="Works night shifts",
        origin="counselor",
        source_session=session,
        source_turn=3,
    )
    client.force_login(profile.user)
    assert "Works night shifts" in client.get(reverse("my_memory")).content.decode()
    client.post(reverse("correct_memory", args=[item.pk]), {"text": "Works day shifts since May"})
    new = MemoryItem.objects.get(supersedes=item)
    assert (new.text, new.origin, new.source_session_id, new.source_turn) == (
        "Works day shifts since May",
        "client",
        session.pk,
        3,
    )
    page = client.get(reverse("my_memory")).content.decode()
    assert "Works day shifts since May" in page and "Works night shifts" not in page
    item.refresh_from_db()
    assert item.text == "Works night shifts"  # the old text is kept, never overwritten
    response = client.post(
        reverse("correct_memory", args=[item.pk]), {"text": "again"}, follow=True
    )
    assert "already corrected" in response.content.decode()
    response = client.post(reverse("correct_memory", args=[new.pk]), {"text": "   "}, follow=True)
    assert "must not be empty" in response.content.decode()


def test_a_client_cannot_correct_someone_elses_memory(client, caplog):  # type: ignore[no-untyped-def]
    other = consenting_client()
    item = MemoryItem.objects.create(
        client=other.user, kind="fact", text="private", origin="counselor"
    )
    client.force_login(consenting_client().user)
    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        response = client.post(reverse("correct_memory", args=[item.pk]), {"text": "hacked"})
    assert response.status_code == 404  # the same answer as for an id that does not exist
    assert "private" not in response.content.decode()
    assert any(f"memory={item.pk}" in r.getMessage() for r in caplog.records)
    assert not MemoryItem.objects.filter(supersedes=item).exists()
