"""Erasing a client stops every round that trained on them and is not approved yet
(issue 18, item 3): the version can never be approved or served, the other clients'
evidence goes back to the buffer, and the erasure report lists the round."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from training_worker.round import run_round
from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.learning import services
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.tests.helpers import (
    make_evidence,
    make_groups,
    make_version,
    write_adapter_files,
)
from webapp.oversight.data_rights import erasure
from webapp.oversight.models import AuditEvent

pytestmark = pytest.mark.django_db

Buffer = CandidateGroup.Buffer


def test_erasing_a_client_during_validation_stops_the_round(client, lipo_settings):  # type: ignore[no-untyped-def]
    groups = make_evidence()  # 3 cbt groups of one client, 3 bt groups of another
    erased = groups[0].client
    run = TrainingRun.objects.create()
    admin = AdminFactory()
    reports: list[erasure.ErasureReport] = []

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "validate":  # the report is written; the hand-off comes next
            reports.append(erasure.erase_client(admin, erased))

    assert run_round(run.pk, progress=progress) == "superseded"

    run.refresh_from_db()
    version = run.output_version
    assert run.status == "failed" and "erased" in run.error
    assert version.status == "failed" and version.evidence_erased
    assert not CandidateGroup.objects.filter(client=erased).exists()
    others = CandidateGroup.objects.exclude(client=erased)
    assert others.count() == 3
    assert set(others.values_list("buffer_status", flat=True)) == {Buffer.AVAILABLE}
    assert not others.exclude(lease_run=None).exists()
    [stopped] = reports[0].stopped_rounds
    assert stopped["run"] == run.pk and stopped["version"] == version.name
    assert stopped["version_status"] == "validating" and stopped["groups"] >= 1
    with pytest.raises(services.DecisionRefused):
        services.approve(version, ClinicianFactory())

    client.force_login(admin)
    page = client.get(reverse("console_erasure", args=[reports[0].event.pk])).content.decode()
    assert 'id="stopped-rounds"' in page and version.name in page


def pending_round(tmp_path: Any, name: str, groups: list[CandidateGroup]) -> AdapterVersion:
    version = make_version(name, "pending_approval", write_adapter_files(tmp_path / name))
    run = TrainingRun.objects.create(
        status="succeeded", output_version=version, batch=[g.pk for g in groups]
    )
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups]).update(
        buffer_status=Buffer.RESERVED, lease_run=run
    )
    return version


def test_a_pending_version_with_the_clients_evidence_can_never_be_approved(tmp_path):  # type: ignore[no-untyped-def]
    mine, theirs, unrelated = make_groups(2), make_groups(2), make_groups(2)
    tainted = pending_round(tmp_path, "v-tainted", [*mine, *theirs])
    clean = pending_round(tmp_path, "v-clean", unrelated)

    report = erasure.erase_client(AdminFactory(), mine[0].client)

    tainted.refresh_from_db()
    assert tainted.status == "failed" and tainted.evidence_erased
    assert "can never be approved" in tainted.decision_note
    assert [(s["version"], s["version_status"], s["groups"], s["returned_to_buffer"])
            for s in report.stopped_rounds] == [("v-tainted", "pending_approval", 2, 2)]  # fmt: skip
    assert {CandidateGroup.objects.get(pk=g.pk).buffer_status for g in theirs} == {Buffer.AVAILABLE}
    event = AuditEvent.objects.get(action="client.erase")
    assert event.detail["rounds_stopped"] == report.stopped_rounds
    clean.refresh_from_db()
    assert clean.status == "pending_approval" and not clean.evidence_erased
    with pytest.raises(services.DecisionRefused):
        services.approve(tainted, ClinicianFactory())
    # Whatever code path writes, the database refuses to make it servable.
    with pytest.raises(IntegrityError), transaction.atomic():
        AdapterVersion.objects.filter(pk=tainted.pk).update(
            status="approved", approved_by=ClinicianFactory(), approved_at=tainted.created_at,
            approved_sha256=tainted.sha256,
        )  # fmt: skip


def test_an_erasure_touching_no_round_reports_none(client, tmp_path):  # type: ignore[no-untyped-def]
    mine, unrelated = make_groups(1), make_groups(2)
    pending = pending_round(tmp_path, "v-other", unrelated)
    admin = AdminFactory()

    report = erasure.erase_client(admin, mine[0].client)

    assert report.stopped_rounds == []
    pending.refresh_from_db()
    assert pending.status == "pending_approval"
    client.force_login(admin)
    page = client.get(reverse("console_erasure", args=[report.event.pk])).content.decode()
    assert "None: no round in flight or pending approval used" in page


def test_the_gate_refuses_a_version_marked_erased_whatever_its_status(tmp_path):  # type: ignore[no-untyped-def]
    active = make_version("v-a", "active", write_adapter_files(tmp_path / "a"))
    marked = make_version(
        "v-m", "pending_approval", write_adapter_files(tmp_path / "m", b"m"),
        parent=active, evidence_erased=True,
    )  # fmt: skip

    with pytest.raises(services.DecisionRefused, match="erased"):
        services.approve(marked, ClinicianFactory())

    marked.refresh_from_db()
    assert marked.status == "pending_approval"
    active.refresh_from_db()
    assert active.status == "active"
