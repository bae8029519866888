from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.accounts.models import ConsentRecord
from webapp.accounts.tests.factories import ClientProfileFactory

pytestmark = pytest.mark.django_db


def test_it_records_each_change_of_consent(client):  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    client.force_login(profile.user)
    assert not profile.has_consent("training")
    client.post(reverse("consent"), {"counseling": "on", "training": "on"})
    assert profile.has_consent("training") and profile.has_consent("counseling")
    assert not profile.has_consent("memory")
    client.post(reverse("consent"), {"counseling": "on"})
    assert not profile.has_consent("training")
    history = list(
        ConsentRecord.objects.filter(profile=profile, purpose="training")
        .order_by("id")
        .values_list("granted", flat=True)
    )
    assert history == [True, False]


def test_it_refuses_to_rewrite_a_consent_record():  # type: ignore[no-untyped-def]
    record = ConsentRecord.objects.create(
        profile=ClientProfileFactory(), purpose="memory", granted=True
    )
    record.granted = False
    with pytest.raises(ValueError, match="append-only"):
        record.save()
