"""Training runs (loss, evidence, shares, duration, outcome) and the adapter lineage."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.learning.models import AdapterVersion, TrainingRun

pytestmark = pytest.mark.django_db


def version(name, status, parent=None, approver=None):  # type: ignore[no-untyped-def]
    fields = {"path": f"/adapters/{name}", "sha256": "ab" * 32}
    if status in ("approved", "active", "retired"):
        fields.update(approved_by=approver, approved_at=timezone.now(), approved_sha256="ab" * 32)
    if status == "active":
        fields["activated_at"] = timezone.now()
    return AdapterVersion.objects.create(name=name, status=status, parent=parent, **fields)


def test_a_run_shows_its_loss_curve_evidence_shares_and_outcome(client):  # type: ignore[no-untyped-def]
    out = version("v1", "pending_approval")
    start = timezone.now() - timedelta(minutes=3)
    run = TrainingRun.objects.create(
        status="succeeded", output_version=out, started_at=start,
        finished_at=start + timedelta(seconds=95), edge_count=320, group_count=40,
        modality_shares={"cbt": 0.55, "het": 0.45},
        loss_curve=[{"step": 1, "loss": 0.69, "grad_norm": 1.2}, {"step": 2, "loss": 0.52, "grad_norm": 0.9}],
        timings={"optimise": 80.5},
    )  # fmt: skip
    client.force_login(AdminFactory())
    listing = client.get(reverse("console_runs")).content.decode()
    assert "Run " + str(run.pk) in listing and "95 s" in listing
    assert "CBT 55.0%" in listing and reverse("learning:adapter", args=[out.pk]) in listing
    page = client.get(reverse("console_run", args=[run.pk])).content.decode()
    assert 'src="data:image/svg+xml;base64,' in page
    assert "0.6900" in page and "0.5200" in page and "320 edges" in page
    assert '<meter min="0" max="1" value="0.55">' in page and "80.5" in page


def test_a_failed_run_shows_its_error_and_no_plot(client):  # type: ignore[no-untyped-def]
    run = TrainingRun.objects.create(status="failed", error="validation failed: <held-out>")
    client.force_login(AdminFactory())
    page = client.get(reverse("console_run", args=[run.pk])).content.decode()
    assert "validation failed: &lt;held-out&gt;" in page and "No loss recorded." in page


def test_the_lineage_shows_who_trained_from_what_and_who_approved(client):  # type: ignore[no-untyped-def]
    nurse = ClinicianFactory(username="dr_ada")
    v1 = version("v1", "retired", approver=nurse)
    v2 = version("v2", "active", parent=v1, approver=nurse)
    v3 = version("v3", "pending_approval", parent=v2)
    other = version("v2b", "rejected", parent=v1)
    TrainingRun.objects.create(status="succeeded", output_version=v2, parent_version=v1)
    client.force_login(AdminFactory())
    page = client.get(reverse("console_lineage")).content.decode()
    order = [page.index(f">{v.name}</a>") for v in (v1, v2, v3, other)]
    assert order == sorted(order)  # each version right after its own ancestors
    assert page.count("dr_ada") == 2 and 'class="indent depth-2"' in page
    assert reverse("learning:adapter", args=[v3.pk]) in page
