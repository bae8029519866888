"""The gate pages: who may see and decide, what they show, and that model text is escaped."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.accounts.tests.factories import AdminFactory, ClientProfileFactory, ClinicianFactory
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.tests.helpers import make_version, write_adapter_files

pytestmark = pytest.mark.django_db

EVIL = '<script>alert("x")</script>'


@pytest.fixture
def pending(tmp_path):  # type: ignore[no-untyped-def]
    parent = make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))
    report = {
        "passed": True,
        "checks": [{"name": "update_norm", "passed": True, "detail": "relative update 0.01"}],
        "side_by_side": [{
            "id": "cbt-stuck", "source": "project", "modality": "cbt",
            "prompt": [{"role": "user", "content": "I feel stuck."}],
            "parent": "Tell me more.", "candidate": EVIL,
        }],
    }  # fmt: skip
    version = make_version(
        "v2", "pending_approval", write_adapter_files(tmp_path / "v2", b"two"),
        parent=parent, validation_report=report,
    )  # fmt: skip
    TrainingRun.objects.create(status="succeeded", output_version=version)
    return version


def test_clinicians_see_the_queue_and_the_side_by_side_replies(client, pending):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    listing = client.get(reverse("learning:adapters"))
    assert listing.status_code == 200 and b"v2" in listing.content

    page = client.get(reverse("learning:adapter", args=[pending.pk]))

    assert page.status_code == 200
    body = page.content.decode()
    assert "Tell me more." in body and "relative update 0.01" in body
    assert EVIL not in body and "&lt;script&gt;" in body  # model output is autoescaped
    assert "Approve and activate" in body and "v2 ← v1 ← base model" in body


def test_clients_get_403_and_anonymous_users_the_login_page(client, pending):  # type: ignore[no-untyped-def]
    urls = [reverse("learning:adapters"), reverse("learning:adapter", args=[pending.pk])]
    for url in urls:
        assert client.get(url)["Location"].startswith(reverse("login"))
    assert client.post(reverse("learning:approve", args=[pending.pk]))["Location"].startswith(
        reverse("login")
    )
    client.force_login(ClientProfileFactory().user)
    for url in [*urls, reverse("learning:approve", args=[pending.pk])]:
        assert client.get(url).status_code == 403
    assert client.post(reverse("learning:approve", args=[pending.pk])).status_code == 403


def test_a_clinician_approves_with_a_post(client, pending):  # type: ignore[no-untyped-def]
    clinician = ClinicianFactory()
    client.force_login(clinician)
    assert client.get(reverse("learning:approve", args=[pending.pk])).status_code == 405

    response = client.post(reverse("learning:approve", args=[pending.pk]), {"note": "good"})

    assert response.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "active" and pending.approved_by == clinician


def test_rejecting_needs_a_reason(client, pending):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    client.post(reverse("learning:reject", args=[pending.pk]), {"reason": ""})
    pending.refresh_from_db()
    assert pending.status == "pending_approval"

    client.post(reverse("learning:reject", args=[pending.pk]), {"reason": "too terse"})
    pending.refresh_from_db()
    assert pending.status == "rejected" and pending.decision_note == "too terse"


def test_admins_may_look_and_roll_back_but_not_approve(client, pending):  # type: ignore[no-untyped-def]
    client.force_login(AdminFactory())
    page = client.get(reverse("learning:adapter", args=[pending.pk]))
    assert page.status_code == 200 and b"Only a clinician" in page.content
    assert client.post(reverse("learning:approve", args=[pending.pk])).status_code == 403

    old = AdapterVersion.objects.get(name="v1")
    client.force_login(ClinicianFactory())
    client.post(reverse("learning:approve", args=[pending.pk]))
    client.force_login(AdminFactory())
    client.post(reverse("learning:rollback", args=[old.pk]), {"reason": "complaints"})
    old.refresh_from_db()
    assert old.status == "active"


def test_the_operator_of_a_round_is_told_to_ask_another_clinician(client, pending):  # type: ignore[no-untyped-def]
    operator = ClinicianFactory()
    TrainingRun.objects.filter(output_version=pending).update(started_by=operator)
    client.force_login(operator)

    page = client.get(reverse("learning:adapter", args=[pending.pk]))
    assert b"another clinician must decide" in page.content
    client.post(reverse("learning:approve", args=[pending.pk]))
    pending.refresh_from_db()
    assert pending.status == "pending_approval"
