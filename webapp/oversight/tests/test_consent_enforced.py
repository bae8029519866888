"""Each consent purpose gates every use of the data it names, checked where the data is
used (issue 18, item 1; the staff socket and the turn path are not covered here)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from counselor_engine import memory as engine_memory
from training_worker.round import heldout_groups
from webapp.accounts.models import ConsentRecord
from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.learning.models import CandidateGroup, TrainingRun
from webapp.learning.schedule import available_graphs
from webapp.learning.services import return_evidence
from webapp.learning.tests.helpers import make_groups
from webapp.memory import services as memory_services
from webapp.memory.models import MemoryItem
from webapp.oversight.models import AuditEvent, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db

Buffer = CandidateGroup.Buffer
ALL = {"counseling": "on", "memory": "on", "training": "on", "clinician_review": "on"}


def choose(client, profile, **off: bool) -> None:  # type: ignore[no-untyped-def]
    """Post "My choices" as the client, unticking the purposes named in ``off``."""
    client.force_login(profile.user)
    client.post(reverse("consent"), {k: v for k, v in ALL.items() if k not in off})
    client.logout()


# -- memory -----------------------------------------------------------------------------


def recap_draft(text: str) -> engine_memory.MemoryItem:
    return engine_memory.MemoryItem(
        id="1", kind="fact", origin="counselor", source_session=None, source_turn=None,
        created_at=engine_memory._now(), text=text,
    )  # fmt: skip


def test_without_memory_consent_no_recap_is_stored_and_no_memory_reaches_a_prompt(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Has a dog called Max", origin="client"
    )
    choose(client, profile, memory=False)
    session = services.start_session(profile.user)
    services.append_turn(session.pk, Turn.Role.CLIENT, "hello", author=profile.user)

    assert memory_services.save_recap(session, [recap_draft("Talked about work")]) == []
    assert services.client_state(session).memory.active() == []  # what the prompt gets
    # The items are kept: the client still reads them on "What I remember".
    client.force_login(profile.user)
    assert "Has a dog called Max" in client.get(reverse("my_memory")).content.decode()

    choose(client, profile)  # given again: the memory is back in the prompt
    assert [i.text for i in services.client_state(session).memory.active()] == [
        "Has a dog called Max"
    ]
    assert [m.text for m in memory_services.save_recap(session, [recap_draft("Work")])] == ["Work"]


# -- clinician review -------------------------------------------------------------------


def test_without_review_consent_the_transcript_and_live_pages_are_refused(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    ended = make_session(profile, client_text="PRIVATE-words about my week")
    live = make_session(profile, open_=True, client_text="PRIVATE-live words")
    choose(client, profile, clinician_review=False)
    client.force_login(profile.clinician)

    for url in (
        reverse("session_review", args=[ended.pk]),
        reverse("live_session", args=[live.pk]),
    ):
        page = client.get(url)
        assert page.status_code == 403, url
        body = page.content.decode()
        assert "withdrawn consent to review" in body and "PRIVATE-" not in body
    denials = AuditEvent.objects.filter(action="access.denied", subject=profile.user)
    assert denials.count() == 2
    assert not AuditEvent.objects.filter(action="transcript.read", subject=profile.user).exists()

    choose(client, profile)  # given again: the pages open
    client.force_login(profile.clinician)
    assert (
        "PRIVATE-words" in client.get(reverse("session_review", args=[ended.pk])).content.decode()
    )


def test_without_review_consent_the_clinician_cannot_read_or_change_memory(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="PRIVATE-has a sister in Leeds", origin="client"
    )
    choose(client, profile, clinician_review=False)
    client.force_login(profile.clinician)
    base = f"/clinician/clients/{profile.user.pk}/memory/"

    page = client.get(base)
    correct = client.post(f"{base}{item.pk}/correct/", {"text": "has a brother"})
    retire = client.post(f"{base}{item.pk}/retire/")

    assert [page.status_code, correct.status_code, retire.status_code] == [403, 403, 403]
    assert "withdrawn consent to review" in page.content.decode()
    assert "PRIVATE-" not in page.content.decode()
    item.refresh_from_db()
    assert item.retired_at is None and not MemoryItem.objects.filter(supersedes=item).exists()
    assert AuditEvent.objects.filter(action="access.denied", subject=profile.user).count() == 3
    assert not AuditEvent.objects.filter(action="memory.read", subject=profile.user).exists()

    choose(client, profile)  # given again: the page opens
    client.force_login(profile.clinician)
    assert "PRIVATE-has a sister" in client.get(base).content.decode()


def test_a_crisis_flag_still_shows_the_clinician_the_flagged_turn_only(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile, open_=True, client_text="PRIVATE-earlier words")
    flagged = Turn.objects.create(
        session=session, seq=2, role="client", text="I want to end it tonight",
        author=profile.user, safety_level="crisis",
    )  # fmt: skip
    Turn.objects.create(session=session, seq=3, role="counselor", text="PRIVATE-safe reply")
    SafetyFlag.objects.create(client=profile.user, session=session, turn=flagged, level="crisis")
    choose(client, profile, clinician_review=False)
    client.force_login(profile.clinician)

    page = client.get(reverse("session_review", args=[session.pk]))

    assert page.status_code == 200
    body = page.content.decode()
    assert "I want to end it tonight" in body and 'id="review-withdrawn"' in body
    assert "PRIVATE-" not in body and "Join the live session" not in body
    event = AuditEvent.objects.get(action="transcript.read_flagged", subject=profile.user)
    assert event.detail["turns"] == [2]
    assert client.get(reverse("live_session", args=[session.pk])).status_code == 403


def test_my_choices_says_what_a_crisis_flag_still_shows(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    client.force_login(profile.user)
    body = client.get(reverse("consent")).content.decode()
    assert 'id="review-exception"' in body and "can read that one message" in body


# -- training ---------------------------------------------------------------------------


def test_withdrawing_training_consent_takes_unclaimed_evidence_out_at_once(client):  # type: ignore[no-untyped-def]
    groups = make_groups(3, "cbt")
    other = make_groups(2, "bt")
    profile = groups[0].client.client_profile
    for purpose in ALL:
        ConsentRecord.objects.create(profile=profile, purpose=purpose, granted=True)
    reserved = groups[2]  # a round holds this one already
    run = TrainingRun.objects.create(status="running", batch=[reserved.pk])
    CandidateGroup.objects.filter(pk=reserved.pk).update(
        buffer_status=Buffer.RESERVED, lease_run=run
    )

    choose(client, profile, training=False)

    statuses = {g.pk: CandidateGroup.objects.get(pk=g.pk) for g in groups}
    assert [statuses[g.pk].buffer_status for g in groups[:2]] == [Buffer.EXCLUDED] * 2
    assert statuses[groups[0].pk].problem == "training consent withdrawn"
    assert statuses[reserved.pk].buffer_status == Buffer.RESERVED  # claimed: the round's
    # The round is rejected later: its returned group stays out of claims and held-out sets.
    assert return_evidence(run) == 1
    assert {g.pk for g in available_graphs()} == {g.pk for g in other}
    assert {g.key for g in heldout_groups([])} == {g.group_key for g in other}

    choose(client, profile)  # given again: what was excluded stays out, the rest may train
    assert {g.pk for g in available_graphs()} == {g.pk for g in other} | {reserved.pk}


def test_the_export_lists_evidence_an_approved_adapter_already_trained_on(client, tmp_path):  # type: ignore[no-untyped-def]
    from webapp.learning.tests.helpers import make_version, write_adapter_files

    used, unused = make_groups(2, "cbt")
    profile = used.client.client_profile
    grant = {"counseling", "memory", "training", "clinician_review"}
    for purpose in grant:
        ConsentRecord.objects.create(profile=profile, purpose=purpose, granted=True)
    version = make_version("v-used", "active", write_adapter_files(tmp_path / "v"))
    run = TrainingRun.objects.create(status="succeeded", output_version=version, batch=[used.pk])
    CandidateGroup.objects.filter(pk=used.pk).update(buffer_status=Buffer.CONSUMED, lease_run=run)
    choose(client, profile, training=False)
    client.force_login(profile.user)

    data = client.get(reverse("my_data_download")).json()

    assert data["used_by_approved_adapters"] == [
        {"group": used.pk, "group_key": used.group_key, "run": run.pk,
         "version": "v-used", "version_status": "active"},
    ]  # fmt: skip
    assert CandidateGroup.objects.get(pk=unused.pk).buffer_status == Buffer.EXCLUDED
