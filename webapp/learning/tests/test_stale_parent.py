"""A version is approvable only while its parent is the active version; otherwise it is
superseded, its evidence goes back to the buffer and a round from the active version can
be queued (issue 19)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from webapp.accounts.tests.factories import ClinicianFactory
from webapp.learning import services
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.tests.helpers import (
    SMALL_LIPO,
    make_evidence,
    make_version,
    write_adapter_files,
)
from webapp.oversight.models import AuditEvent

Buffer = CandidateGroup.Buffer


def pending_round(tmp_path, name: str, parent: AdapterVersion | None) -> AdapterVersion:  # type: ignore[no-untyped-def]
    """A pending version from its own round, which holds 4 reserved groups (12 edges)."""
    version = make_version(
        name, "pending_approval", write_adapter_files(tmp_path / name, name.encode()),
        parent=parent,
    )  # fmt: skip
    ids = [g.pk for g in make_evidence(2)]
    run = TrainingRun.objects.create(
        status="succeeded", output_version=version, parent_version=parent, batch=ids
    )
    CandidateGroup.objects.filter(pk__in=ids).update(
        buffer_status=Buffer.RESERVED, lease_run=run, lease_expires_at=None
    )
    return version


def buffer_of(version: AdapterVersion) -> set[str]:
    """Where the groups of the round that made ``version`` are now (a returned group
    loses its lease, so they are found through the run's batch)."""
    run = TrainingRun.objects.get(output_version=version)
    return set(
        CandidateGroup.objects.filter(pk__in=run.batch).values_list("buffer_status", flat=True)
    )


@pytest.fixture
def siblings(tmp_path, settings):  # type: ignore[no-untyped-def]
    """v1 active; two rounds trained from v1 wait for approval: v2a and v2b."""
    settings.LIPO = replace(settings.LIPO, **SMALL_LIPO)
    v1 = make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))
    return v1, pending_round(tmp_path, "v2a", v1), pending_round(tmp_path, "v2b", v1)


@pytest.mark.django_db
def test_it_approves_one_of_two_rounds_and_the_other_cannot_be_approved(siblings):  # type: ignore[no-untyped-def]
    _, v2a, v2b = siblings

    services.approve(v2a, ClinicianFactory())

    v2a.refresh_from_db()
    v2b.refresh_from_db()
    assert v2a.status == "active"
    assert v2b.status == "superseded"
    assert "trained from v1" in v2b.decision_note and "v2a is active" in v2b.decision_note
    assert buffer_of(v2a) == {Buffer.CONSUMED}
    assert buffer_of(v2b) == {Buffer.AVAILABLE}  # its evidence is back in the buffer
    assert not CandidateGroup.objects.filter(lease_run__output_version=v2b).exists()
    with pytest.raises(services.DecisionRefused, match="superseded"):
        services.approve(v2b, ClinicianFactory())
    v2b.refresh_from_db()
    assert v2b.status == "superseded" and v2b.approved_by is None
    assert AuditEvent.objects.filter(action="adapter.supersede", target="adapter:v2b").exists()


@pytest.mark.django_db
def test_a_round_from_the_active_version_is_queued_with_the_returned_evidence(siblings):  # type: ignore[no-untyped-def]
    _, v2a, _ = siblings

    services.approve(v2a, ClinicianFactory())

    queued = TrainingRun.objects.get(status="queued")
    assert queued.trigger == "superseded"
    # The worker records the parent when it claims the batch: the version active then.
    assert services.active_version() == v2a


@pytest.mark.django_db
def test_no_second_round_is_queued_while_one_waits(siblings):  # type: ignore[no-untyped-def]
    _, v2a, _ = siblings
    TrainingRun.objects.create(status="queued", trigger="schedule")

    services.approve(v2a, ClinicianFactory())

    assert TrainingRun.objects.filter(status="queued").count() == 1


@pytest.mark.django_db
def test_approve_itself_refuses_a_version_whose_parent_is_not_active(tmp_path, settings):  # type: ignore[no-untyped-def]
    """A version that reached the gate after the active version changed (no sibling was
    approved in front of it) is caught by approve: marked superseded, and that sticks."""
    settings.LIPO = replace(settings.LIPO, **SMALL_LIPO)
    old = make_version("v0", "retired", write_adapter_files(tmp_path / "v0", b"zero"))
    v1 = make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))
    late = pending_round(tmp_path, "late", old)

    with pytest.raises(services.SupersededVersion, match="trained from v0, but v1 is active"):
        services.approve(late, ClinicianFactory())

    late.refresh_from_db()
    v1.refresh_from_db()
    assert late.status == "superseded" and v1.status == "active"
    assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {Buffer.AVAILABLE}


@pytest.mark.django_db
def test_a_version_trained_from_the_base_model_is_stale_once_any_version_is_active(tmp_path):  # type: ignore[no-untyped-def]
    make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))
    from_base = pending_round(tmp_path, "b1", None)

    with pytest.raises(services.SupersededVersion, match="trained from the base model"):
        services.approve(from_base, ClinicianFactory())


@pytest.mark.django_db
def test_rollback_supersedes_versions_trained_from_the_version_it_retires(siblings, tmp_path):  # type: ignore[no-untyped-def]
    v1, v2a, _ = siblings
    services.approve(v2a, ClinicianFactory())
    v3 = pending_round(tmp_path, "v3", v2a)

    services.rollback(v1, ClinicianFactory(), "v2a sounded curt")

    v3.refresh_from_db()
    assert v3.status == "superseded" and "trained from v2a, but v1 is active" in v3.decision_note
    assert buffer_of(v3) == {Buffer.AVAILABLE}


@pytest.mark.django_db
def test_the_adapters_page_shows_why_a_version_was_superseded(client, siblings):  # type: ignore[no-untyped-def]
    _, v2a, _ = siblings
    services.approve(v2a, ClinicianFactory())
    client.force_login(ClinicianFactory())

    body = client.get(reverse("learning:adapters")).content.decode()

    assert "Superseded" in body and "v2b was trained from v1, but v2a is active now" in body


@pytest.mark.django_db(transaction=True)
def test_two_clinicians_approving_siblings_at_once_activate_exactly_one(siblings):  # type: ignore[no-untyped-def]
    _, v2a, v2b = siblings
    clinicians = [ClinicianFactory(), ClinicianFactory()]
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def decide(version: AdapterVersion, clinician: Any) -> None:
        barrier.wait()
        try:
            services.approve(version, clinician)
            outcomes[version.name] = "approved"
        except services.DecisionRefused as exc:
            outcomes[version.name] = f"refused: {exc}"
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(v, c))
        for v, c in zip((v2a, v2b), clinicians, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sorted(o.split(":")[0] for o in outcomes.values()) == ["approved", "refused"]
    statuses = dict(
        AdapterVersion.objects.filter(name__in=["v2a", "v2b"]).values_list("name", "status")
    )
    assert sorted(statuses.values()) == ["active", "superseded"]
    winner = next(n for n, o in outcomes.items() if o == "approved")
    assert statuses[winner] == "active"


@pytest.mark.django_db
def test_a_round_whose_parent_is_replaced_while_it_trains_is_superseded_at_hand_off(
    lipo_settings, tmp_path, monkeypatch
):  # type: ignore[no-untyped-def]
    """The round claims its batch from the base model; before it reaches the gate a
    clinician activates another version. The output is superseded at once."""
    from training_worker import round as lipo_round

    make_evidence()
    run = TrainingRun.objects.create(trigger="test")
    other = make_version("side", "approved", write_adapter_files(tmp_path / "side", b"side"))
    original = lipo_round._hand_off

    def activate_meanwhile(fence, version, report):  # type: ignore[no-untyped-def]
        services.rollback(other, ClinicianFactory(), "activated while the round trained")
        return original(fence, version, report)

    monkeypatch.setattr(lipo_round, "_hand_off", activate_meanwhile)

    assert lipo_round.run_round(run.pk) == "stale_parent"

    run.refresh_from_db()
    version = run.output_version
    assert run.status == "succeeded" and version.parent is None
    assert version.status == "superseded"
    assert "trained from the base model, but side is active" in version.decision_note
    assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {Buffer.AVAILABLE}
