"""A client downloads all their data; an admin erases a client, keeping a tombstone."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.models import ClientProfile, ConsentRecord, User
from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.counseling.models import Course, Session, Turn
from webapp.learning.models import (
    AdapterVersion,
    CandidateGroup,
    PosteriorCell,
    PosteriorUpdate,
    SkillDecision,
    TrainingRun,
)
from webapp.lib import audit
from webapp.memory import services as memory_services
from webapp.memory.models import MemoryItem
from webapp.oversight.data_rights import erasure
from webapp.oversight.models import AlertOutbox, AuditEvent, ClientControl, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


def rich_client():  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    first = make_session(
        profile, rating={"relationship": 8, "goals_and_topics": 7, "approach": 9, "overall": 8}
    )
    make_session(profile, skill="CBT2")
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Has a dog called Max", origin="counselor",
        source_session=first, source_turn=1,
    )  # fmt: skip
    memory_services.correct(item.pk, "Has two dogs", by=profile.clinician, client=profile.user)
    flag = SafetyFlag.objects.create(
        client=profile.user, session=first, turn=first.turns.first(), level="crisis"
    )
    AlertOutbox.objects.create(flag=flag, recipient=profile.clinician)
    ClientControl.objects.create(client=profile.user, excluded_skills=["CBT5"])
    audit.record(
        profile.clinician, "transcript.read", subject=profile.user, target=f"session:{first.pk}"
    )
    return profile, first


def test_a_client_downloads_all_their_data_as_json(client):  # type: ignore[no-untyped-def]
    profile, first = rich_client()
    stranger, _ = rich_client()
    client.force_login(profile.user)
    assert "Download my data (JSON)" in client.get(reverse("my_data")).content.decode()
    response = client.get(reverse("my_data_download"))
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="psyevo-my-data-')
    data = json.loads(response.content)
    assert data["format"] == "psyevo.client-export/1"
    assert data["account"]["username"] == profile.user.username
    assert data["profile"]["modality"] == "cbt" and len(data["profile"]["consents"]) == 4
    assert data["sessions"][0]["id"] == first.pk and len(data["sessions"]) == 2
    turns = data["sessions"][0]["turns"]
    assert [t["role"] for t in turns] == ["client", "counselor"]
    assert turns[1]["decision"]["chosen"] == "CBT1" and len(turns[1]["candidates"]["texts"]) == 3
    assert data["sessions"][0]["rating"]["overall"] == 8
    assert [m["text"] for m in data["memory"]] == ["Has a dog called Max", "Has two dogs"]
    assert data["memory"][1]["supersedes"] == data["memory"][0]["id"]
    assert {c["skill"] for c in data["posterior"]} == {"CBT1", "CBT2"}
    assert all(len(c["updates"]) == 1 for c in data["posterior"])
    assert data["safety_flags"][0]["level"] == "crisis"
    assert data["controls"]["excluded_skills"] == ["CBT5"]
    assert ("transcript.read", "clinician") in {
        (e["action"], e["actor_role"]) for e in data["access_log"]
    }
    assert stranger.user.username not in response.content.decode()
    assert AuditEvent.objects.filter(action="data.export", actor=profile.user).exists()


def used_evidence(profile, tmp_path):  # type: ignore[no-untyped-def]
    """An approved adapter whose training run consumed one of the client's groups."""
    group = CandidateGroup.objects.filter(client=profile.user).first()
    side = [
        {"group": group.group_key, "prompt": [{"role": "user", "content": "my secret"}],
         "parent": "a", "candidate": "b"},
        {"group": "someone-else", "prompt": [{"role": "user", "content": "other"}],
         "parent": "c", "candidate": "d"},
    ]  # fmt: skip
    version = AdapterVersion.objects.create(
        validation_report={"passed": True, "side_by_side": side},
        name="v-used", status="active", path=str(tmp_path), sha256="cd" * 32,
        approved_by=ClinicianFactory(), approved_at=timezone.now(), approved_sha256="cd" * 32,
    )  # fmt: skip
    run = TrainingRun.objects.create(status="succeeded", output_version=version, batch=[group.pk])
    CandidateGroup.objects.filter(pk=group.pk).update(buffer_status="consumed", lease_run=run)
    return group, run


def test_an_admin_erases_a_client_and_the_audit_keeps_a_tombstone(client, tmp_path):  # type: ignore[no-untyped-def]
    profile, _ = rich_client()
    keep, _ = rich_client()  # another client's data is untouched
    group, run = used_evidence(profile, tmp_path)
    user, username = profile.user, profile.user.username
    earlier = set(AuditEvent.objects.filter(subject=user).values_list("pk", flat=True))
    admin = AdminFactory()
    client.force_login(admin)
    url = reverse("console_erase", args=[user.pk])
    page = client.get(url).content.decode()
    assert "Evidence already used by approved adapters" in page and "v-used" in page

    response = client.post(url, {"confirm": username})
    assert response.status_code == 302

    for model, field in [
        (Session, "client"), (Course, "client"), (CandidateGroup, "client"),
        (PosteriorCell, "client"), (MemoryItem, "client"), (SafetyFlag, "client"),
        (ClientControl, "client"), (ClientProfile, "user"),
    ]:  # fmt: skip
        assert not model.objects.filter(**{field: user}).exists(), model
    assert not Turn.objects.filter(session__client=user).exists()
    assert not PosteriorUpdate.objects.filter(cell__client=user).exists()
    assert not SkillDecision.objects.filter(turn__session__client=user).exists()
    assert not AlertOutbox.objects.filter(flag__client=user).exists()
    assert not ConsentRecord.objects.filter(profile__user=user).exists()
    user.refresh_from_db()
    assert (user.username, user.email, user.is_active, user.has_usable_password()) == (
        f"erased-{user.pk}", "", False, False,
    )  # fmt: skip

    tombstone = AuditEvent.objects.get(action="client.erase")
    assert tombstone.subject is None and tombstone.actor == admin
    assert tombstone.detail["former_user_id"] == user.pk
    assert tombstone.detail["former_username_hmac"] == erasure.username_hash(username)
    assert username not in json.dumps(tombstone.detail)
    assert (
        tombstone.detail["deleted"]["sessions"] == 2 and tombstone.detail["deleted"]["turns"] == 4
    )
    assert tombstone.detail["evidence_used_by_approved_adapters"] == [
        {"group": group.pk, "group_key": group.group_key, "run": run.pk,
         "version": "v-used", "version_status": "active"},
    ]  # fmt: skip
    # The earlier audit rows survive untouched (append-only), pointing at the shell.
    assert set(AuditEvent.objects.filter(subject=user).values_list("pk", flat=True)) == earlier
    assert Session.objects.filter(client=keep.user).count() == 2
    side = AdapterVersion.objects.get(name="v-used").validation_report["side_by_side"]
    assert "my secret" not in json.dumps(side) and side[0]["erased"] is True
    assert side[1]["prompt"][0]["content"] == "other"
    assert tombstone.detail["deleted"]["validation report entries"] == 1

    report = client.get(reverse("console_erasure", args=[tombstone.pk])).content.decode()
    assert erasure.username_hash(username) in report and 'id="used-evidence"' in report
    assert username not in report


def test_erasure_needs_the_username_typed(client):  # type: ignore[no-untyped-def]
    profile, _ = rich_client()
    client.force_login(AdminFactory())
    response = client.post(reverse("console_erase", args=[profile.user_id]), {"confirm": "nope"})
    assert response.status_code == 400 and "not this client" in response.content.decode()
    assert Session.objects.filter(client=profile.user).count() == 2
    assert not AuditEvent.objects.filter(action="client.erase").exists()


def test_only_clients_can_be_erased_and_only_once(client):  # type: ignore[no-untyped-def]
    profile, _ = rich_client()
    admin = AdminFactory()
    with pytest.raises(erasure.ErasureError):
        erasure.erase_client(admin, profile.clinician)
    erasure.erase_client(admin, profile.user)
    with pytest.raises(erasure.ErasureError):
        erasure.erase_client(admin, User.objects.get(pk=profile.user_id))
    client.force_login(admin)
    assert client.get(reverse("console_erase", args=[profile.user_id])).status_code == 404
