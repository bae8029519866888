"""The audit log: role and assignment changes are recorded wherever they are made; admins
filter the log and export it as CSV."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory, UserFactory
from webapp.lib import audit
from webapp.oversight.models import AuditEvent
from webapp.oversight.tests.helpers import client_profile

pytestmark = pytest.mark.django_db


def test_a_role_change_in_code_is_audited(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    user = UserFactory()
    with django_capture_on_commit_callbacks(execute=True):
        user.role = "clinician"
        user.save()
    event = AuditEvent.objects.get(action="role.change", subject=user)
    assert event.actor is None
    assert event.detail == {"before": "client", "after": "clinician", "via": "code"}
    with django_capture_on_commit_callbacks(execute=True):
        user.first_name = "Ada"
        user.save()
        user.save(update_fields=["last_login"])
    assert AuditEvent.objects.filter(action="role.change").count() == 1


def test_granting_a_staff_role_at_creation_is_audited(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True):
        admin = AdminFactory()
        plain = UserFactory()
    assert AuditEvent.objects.filter(action="role.change", subject=admin).exists()
    assert not AuditEvent.objects.filter(action="role.change", subject=plain).exists()


def test_reassigning_a_client_in_the_django_admin_names_the_admin(
    client, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    profile = client_profile()
    old, new = profile.clinician, ClinicianFactory(username="dr_new")
    admin = AdminFactory(is_superuser=True)
    client.force_login(admin)
    url = reverse("admin:accounts_clientprofile_change", args=[profile.pk])
    form = {
        "user": profile.user_id, "modality": "cbt", "clinician": new.pk,
        "consents-TOTAL_FORMS": "4", "consents-INITIAL_FORMS": "4",
        "consents-MIN_NUM_FORMS": "0", "consents-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    for i, record in enumerate(profile.consents.order_by("id")):
        form[f"consents-{i}-id"] = record.pk
        form[f"consents-{i}-profile"] = profile.pk
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    profile.refresh_from_db()
    assert profile.clinician == new
    event = AuditEvent.objects.get(action="assignment.change")
    assert (event.actor, event.subject) == (admin, profile.user)
    assert event.detail == {"before": old.username, "after": "dr_new", "via": "django-admin"}


def test_admins_filter_the_log(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    audit.record(profile.clinician, "transcript.read", subject=profile.user, target="session:1")
    audit.record(profile.clinician, "memory.read", subject=profile.user)
    audit.record(ClinicianFactory(), "transcript.read", subject=client_profile().user)
    client.force_login(AdminFactory())
    url = reverse("console_audit")
    page = client.get(
        url, {"action": "transcript", "actor": profile.clinician.username}
    ).content.decode()
    assert "1 event," in page and "session:1" in page and "memory.read" not in page
    page = client.get(url, {"subject": profile.user.username}).content.decode()
    assert "2 events," in page
    page = client.get(url, {"subject": str(profile.user_id)}).content.decode()
    assert "2 events," in page


def test_the_csv_export_follows_the_filter_and_is_audited(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    audit.record(profile.clinician, "memory.read", subject=profile.user, note="=HYPERLINK(1)")
    audit.record(
        profile.clinician, "transcript.read", subject=profile.user, target="=cmd|' /C calc'!A0"
    )
    admin = AdminFactory()
    client.force_login(admin)
    response = client.get(reverse("console_audit_csv"), {"action": "transcript"})
    assert response["Content-Type"] == "text/csv"
    assert response["Content-Disposition"].startswith('attachment; filename="psyevo-audit-')
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == [
        "id",
        "created_at",
        "action",
        "actor",
        "actor_role",
        "subject",
        "target",
        "detail",
    ]
    assert [r[2] for r in rows[1:]] == ["transcript.read"]
    assert rows[1][3:6] == [profile.clinician.username, "clinician", profile.user.username]
    assert rows[1][6] == "'=cmd|' /C calc'!A0"  # a formula is defused for spreadsheets
    export = AuditEvent.objects.get(action="audit.export")
    assert export.actor == admin and export.detail == {"filters": {"action": "transcript"}}
