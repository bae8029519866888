"""The approval gate: approve-and-activate, reject, rollback, tamper detection, leases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from webapp.accounts.tests.factories import AdminFactory, ClientProfileFactory, ClinicianFactory
from webapp.counseling.models import Course, Session
from webapp.learning import services
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.tests.helpers import make_evidence, make_version, write_adapter_files
from webapp.oversight.models import AuditEvent

pytestmark = pytest.mark.django_db

Buffer = CandidateGroup.Buffer


@pytest.fixture
def active(tmp_path):  # type: ignore[no-untyped-def]
    return make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))


@pytest.fixture
def pending(tmp_path):  # type: ignore[no-untyped-def]
    """A pending version produced by a run that holds 4 evidence groups, trained from the
    version active when it is made (so it is approvable)."""
    version = make_version(
        "v2", "pending_approval", write_adapter_files(tmp_path / "v2", b"two"),
        parent=services.active_version(),
    )  # fmt: skip
    run = TrainingRun.objects.create(status="succeeded", output_version=version)
    groups = make_evidence(2)
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups]).update(
        buffer_status=Buffer.RESERVED, lease_run=run, lease_expires_at=None
    )
    return version


def start_session(client_user=None):  # type: ignore[no-untyped-def]
    """What the chat code does when a session starts: pin the active version."""
    user = client_user or ClientProfileFactory().user
    course = Course.objects.create(client=user, modality="cbt")
    return Session.objects.create(
        course=course, client=user, index=0, adapter_version=services.active_version()
    )


def test_it_activates_an_approved_version_for_sessions_that_start_afterwards(active, pending):  # type: ignore[no-untyped-def]
    in_progress = start_session()
    clinician = ClinicianFactory()

    services.approve(pending, clinician, "replies read well")

    pending.refresh_from_db()
    active.refresh_from_db()
    assert pending.status == "active" and active.status == "retired"
    assert pending.approved_by == clinician and pending.approved_at is not None
    assert (
        pending.approved_sha256 == pending.sha256 and pending.decision_note == "replies read well"
    )
    in_progress.refresh_from_db()
    assert in_progress.adapter_version == active  # a session keeps its pinned version
    assert start_session().adapter_version == pending  # the next one gets the new version
    assert set(AuditEvent.objects.values_list("action", flat=True)) >= {
        "adapter.approve", "adapter.activate"
    }  # fmt: skip


def test_activation_consumes_the_evidence(pending):  # type: ignore[no-untyped-def]
    services.approve(pending, ClinicianFactory())

    assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {Buffer.CONSUMED}


def test_it_refuses_approval_by_the_operator_who_started_the_round(pending):  # type: ignore[no-untyped-def]
    operator = ClinicianFactory()
    TrainingRun.objects.filter(output_version=pending).update(started_by=operator)

    with pytest.raises(services.DecisionRefused, match="started the round"):
        services.approve(pending, operator)

    pending.refresh_from_db()
    assert pending.status == "pending_approval"


def test_only_a_clinician_can_approve(pending):  # type: ignore[no-untyped-def]
    for user in (AdminFactory(), ClientProfileFactory().user):
        with pytest.raises(services.DecisionRefused, match="only a clinician"):
            services.approve(pending, user)


def test_it_refuses_to_approve_twice(pending):  # type: ignore[no-untyped-def]
    services.approve(pending, ClinicianFactory())
    with pytest.raises(services.DecisionRefused, match="not pending"):
        services.approve(pending, ClinicianFactory())


def test_rejection_needs_a_reason_and_returns_the_evidence(active, pending):  # type: ignore[no-untyped-def]
    clinician = ClinicianFactory()
    with pytest.raises(services.DecisionRefused, match="reason"):
        services.reject(pending, clinician, "  ")

    services.reject(pending, clinician, "too directive")

    pending.refresh_from_db()
    active.refresh_from_db()
    assert pending.status == "rejected" and pending.decision_note == "too directive"
    assert active.status == "active"
    assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {Buffer.AVAILABLE}
    assert not CandidateGroup.objects.filter(lease_run__isnull=False).exists()
    assert AuditEvent.objects.filter(action="adapter.reject").exists()


def test_rollback_reactivates_an_earlier_approved_version(active, pending):  # type: ignore[no-untyped-def]
    services.approve(pending, ClinicianFactory())
    admin = AdminFactory()

    services.rollback(active, admin, "clients found v2 curt")

    active.refresh_from_db()
    pending.refresh_from_db()
    assert active.status == "active" and pending.status == "retired"
    event = AuditEvent.objects.get(action="adapter.rollback")
    assert event.actor == admin and event.detail["previous"] == "v2"


def test_rollback_refuses_versions_never_approved(tmp_path, active):  # type: ignore[no-untyped-def]
    rejected = make_version("v3", "rejected", write_adapter_files(tmp_path / "v3"))
    with pytest.raises(services.DecisionRefused):
        services.rollback(rejected, AdminFactory())
    with pytest.raises(services.DecisionRefused):
        services.rollback(active, ClientProfileFactory().user)


@pytest.mark.parametrize("tamper", ["edit", "add", "remove"])
def test_it_refuses_tampered_files_everywhere(tmp_path, active, pending, tamper):  # type: ignore[no-untyped-def]
    folder = tmp_path / "v1"
    if tamper == "edit":
        (folder / "adapter_model.safetensors").write_bytes(b"oNe")
    elif tamper == "add":
        (folder / "extra.py").write_text("import os")
    else:
        (folder / "adapter_config.json").unlink()

    with pytest.raises(services.TamperedAdapter):
        services.servable_path(active)
    services.approve(pending, ClinicianFactory())  # retires v1
    with pytest.raises(services.TamperedAdapter):
        services.rollback(active, AdminFactory())
    active.refresh_from_db()
    assert active.status == "retired"


def test_it_refuses_to_approve_files_changed_after_validation(tmp_path, pending):  # type: ignore[no-untyped-def]
    (tmp_path / "v2" / "adapter_model.safetensors").write_bytes(b"swapped")
    with pytest.raises(services.TamperedAdapter):
        services.approve(pending, ClinicianFactory())
    pending.refresh_from_db()
    assert pending.status == "pending_approval"


def test_it_serves_only_approved_versions(tmp_path, active, pending):  # type: ignore[no-untyped-def]
    served = services.servable_path(active)
    assert services.adapter_digest(served) == active.approved_sha256
    with pytest.raises(services.NotServable):
        services.servable_path(pending)


def test_expired_leases_return_evidence_and_fail_the_lost_round():  # type: ignore[no-untyped-def]
    groups = make_evidence(2)
    version = AdapterVersion.objects.create(name="v9", status="training")
    soon = timezone.now() + timedelta(minutes=5)
    run = TrainingRun.objects.create(
        status="running", phase="optimise", attempts=1, lease_expires_at=soon,
        output_version=version,
    )  # fmt: skip
    held = TrainingRun.objects.create(status="succeeded")  # pending approval: no expiry
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups[:2]]).update(
        buffer_status=Buffer.RESERVED, lease_run=run, lease_expires_at=soon
    )
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups[2:]]).update(
        buffer_status=Buffer.RESERVED, lease_run=held, lease_expires_at=None
    )

    assert services.release_expired_leases() == 0  # not yet expired
    assert services.release_expired_leases(now=soon + timedelta(seconds=1)) == 2

    run.refresh_from_db()
    version.refresh_from_db()
    assert run.status == "failed" and "phase optimise" in run.error
    assert version.status == "failed"
    assert CandidateGroup.objects.filter(lease_run=held, buffer_status=Buffer.RESERVED).count() == 2


def test_the_database_refuses_broken_gate_states(tmp_path, active):  # type: ignore[no-untyped-def]
    clinician = ClinicianFactory()
    approval = {"approved_by": clinician, "approved_at": timezone.now()}
    with pytest.raises(IntegrityError), transaction.atomic():  # two active versions
        make_version("v4", "active", write_adapter_files(tmp_path / "v4"))
    with pytest.raises(IntegrityError), transaction.atomic():  # active without approval
        AdapterVersion.objects.create(name="v5", status="active", path="x", sha256="a" * 64)
    with pytest.raises(IntegrityError), transaction.atomic():  # approval of other files
        AdapterVersion.objects.create(
            name="v6", status="approved", path="x", sha256="a" * 64, approved_sha256="b" * 64,
            **approval,
        )  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():  # reviewed without files
        AdapterVersion.objects.create(name="v7", status="pending_approval")
    with pytest.raises(IntegrityError), transaction.atomic():  # reserved without a lease
        group = make_evidence(1)[0]
        CandidateGroup.objects.filter(pk=group.pk).update(buffer_status=Buffer.RESERVED)


def test_it_serves_the_verified_bytes_not_the_folder_read_again(tmp_path, active):  # type: ignore[no-untyped-def]
    """The loader reads a snapshot written from the bytes that were hashed: a file
    swapped into the version's folder after the check is never what gets loaded."""
    original = (tmp_path / "v1" / "adapter_model.safetensors").read_bytes()
    served = services.servable_path(active)
    assert served != tmp_path / "v1"

    (tmp_path / "v1" / "adapter_model.safetensors").write_bytes(b"swapped after the check")
    assert (served / "adapter_model.safetensors").read_bytes() == original
    assert services.adapter_digest(served) == active.approved_sha256
    # Whatever is planted in the snapshot, the next successful check rewrites it from
    # the verified bytes and removes the extra file.
    (served / "adapter_model.safetensors").write_bytes(b"planted")
    (served / "extra.py").write_text("import os")
    with pytest.raises(services.TamperedAdapter):
        services.servable_path(active)
    (tmp_path / "v1" / "adapter_model.safetensors").write_bytes(original)
    assert services.servable_path(active) == served
    assert services.adapter_digest(served) == active.approved_sha256
    assert not (served / "extra.py").exists()


def test_snapshots_are_removed_once_no_session_can_load_them(tmp_path, active, pending):  # type: ignore[no-untyped-def]
    """A retired version's snapshot stays while a session pinned to it is open, and goes
    with the next load after that session ends; a rejected version's never stays."""
    pinned = start_session()  # keeps v1 to its end
    old = services.servable_path(active)
    services.approve(pending, ClinicianFactory())  # v1 retired, v2 active
    new = services.servable_path(pending)
    assert old.is_dir() and new.is_dir()

    pinned.status, pinned.ended_at = Session.Status.ENDED, timezone.now()
    pinned.save(update_fields=["status", "ended_at"])
    assert services.prune_snapshots() == [old.name]
    assert not old.exists() and new.is_dir()

    rejected = make_version(
        "v3", "pending_approval", write_adapter_files(tmp_path / "v3", b"three"),
        parent=services.active_version(),
    )  # fmt: skip
    stray = old.parent / "v3-0123456789abcdef"  # say, left by a crash mid-decision
    stray.mkdir()
    services.reject(rejected, ClinicianFactory(), "not better")
    assert services.servable_path(pending) == new  # every load prunes
    assert not stray.exists() and sorted(p.name for p in old.parent.iterdir()) == [new.name]
