"""Erasure removes the former username from django-axes' login records and the Django
admin's log too (issue 18, item 5), and leaves other accounts' rows alone."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType

from webapp.accounts.models import ClientProfile, ConsentRecord, User
from webapp.accounts.tests.factories import AdminFactory, ClientProfileFactory, UserFactory
from webapp.oversight.data_rights import erasure

pytestmark = pytest.mark.django_db

AXES = (AccessLog, AccessFailureLog, AccessAttempt)


def login_records(username: str) -> None:
    common = {"username": username, "ip_address": "10.0.0.1", "user_agent": "ua",
              "http_accept": "*/*", "path_info": "/login/"}  # fmt: skip
    AccessLog.objects.create(**common)
    AccessFailureLog.objects.create(**common)
    AccessAttempt.objects.create(
        **common, get_data=f"next=/?u={username}", post_data=f"username={username}",
        failures_since_start=2,
    )  # fmt: skip


def admin_entry(admin: User, model: type, pk: int, repr_: str) -> LogEntry:
    return LogEntry.objects.create(
        user=admin, content_type=ContentType.objects.get_for_model(model), object_id=str(pk),
        object_repr=repr_, action_flag=CHANGE,
        change_message=f'[{{"changed": {{"name": "{repr_}", "fields": ["email"]}}}}]',
    )  # fmt: skip


def test_erasure_scrubs_the_username_from_axes_and_the_admin_log() -> None:
    admin = AdminFactory()
    profile = ClientProfileFactory(user=UserFactory(username="ann"))
    other = ClientProfileFactory(user=UserFactory(username="joanne"))
    consent = ConsentRecord.objects.create(profile=profile, purpose="memory", granted=True)
    login_records("ann")
    login_records("joanne")
    entries = [
        admin_entry(admin, User, profile.user_id, "ann"),
        admin_entry(admin, ClientProfile, profile.user_id, "ann (cbt)"),
        admin_entry(admin, ConsentRecord, consent.pk, str(consent)),
    ]
    theirs = admin_entry(admin, User, other.user_id, "joanne")

    report = erasure.erase_client(admin, profile.user)

    shell = f"erased-{profile.user_id}"
    for model in AXES:
        assert not model.objects.filter(username="ann").exists(), model
        assert model.objects.filter(username=shell).count() == 1, model
        assert model.objects.filter(username="joanne").count() == 1, model
    attempt = AccessAttempt.objects.get(username=shell)
    assert "ann" not in attempt.get_data + attempt.post_data
    for entry in entries:
        entry.refresh_from_db()
        assert "ann" not in entry.object_repr and "ann" not in entry.change_message
        assert shell in entry.object_repr
    theirs.refresh_from_db()
    assert (theirs.object_repr, '"joanne"' in theirs.change_message) == ("joanne", True)
    assert report.counts["login records (name removed)"] == 3
    assert report.counts["admin log entries (name removed)"] == 3
