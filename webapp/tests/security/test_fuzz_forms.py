"""Hypothesis over every form of the site and the rating parser.

Whatever a browser posts, ``is_valid`` answers (never raises) and refused data comes back
with errors; a memory correction posted with NUL or lone surrogates is refused with a
message and stores nothing (PostgreSQL cannot hold either).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from django import forms
from django.urls import reverse
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webapp.accounts.forms import ConsentForm, LoginForm, TokenForm
from webapp.accounts.models import ConsentPurpose
from webapp.counseling.forms import ITEMS, RatingForm
from webapp.counseling.services import rating_from
from webapp.lib.forms import MemoryCorrectionForm
from webapp.memory.models import MemoryItem
from webapp.oversight.forms import (
    AuditFilterForm,
    CheckpointForm,
    EraseForm,
    PopulationForm,
    SkillControlForm,
)
from webapp.tests.security.conftest import login

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Any code point a form post can carry (Django decodes bad UTF-8 to U+FFFD, but forms are
# also built from JSON and code): NUL, controls and lone surrogates included.
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
values = any_text | st.lists(any_text, max_size=3)
FIELDS = [
    "username", "password", "token", "skip", "pinned", "excluded", "text", "before",
    "after", "action", "actor", "subject", "since", "until", "modality", "confirm",
    *(name for name, _ in ITEMS), *(p.value for p in ConsentPurpose),
]  # fmt: skip
posts = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


def _forms(data: dict[str, Any]) -> list[forms.Form]:
    from django.http import QueryDict
    from django.test import RequestFactory

    query = QueryDict(mutable=True)
    for key, value in data.items():
        query.setlist(key, value if isinstance(value, list) else [value])
    return [
        # The login view hands the form its request: django-axes refuses to authenticate
        # without one (it keys lockouts on the client's address).
        LoginForm(RequestFactory().post(reverse("login")), data=query),
        ConsentForm(query),
        TokenForm(query),
        RatingForm(query),
        SkillControlForm("cbt", query),
        MemoryCorrectionForm(query),
        CheckpointForm(query),
        AuditFilterForm(query),
        PopulationForm(query),
        EraseForm("client_a", query),
    ]


@pytest.mark.django_db
@FUZZ
@given(data=posts)
@example(data={"text": "a\x00b", "token": "12\x0034", "confirm": "\ud800"})
@example(data={"relationship": "nan", "approach": "inf", "since": "99999-99-99"})
@example(data={"username": "0", "password": "0"})
def test_every_form_answers_any_post_with_data_or_errors(db: Any, data: dict[str, Any]) -> None:
    for form in _forms(data):
        valid = form.is_valid()
        assert valid or form.errors, type(form).__name__
        if valid:
            for value in form.cleaned_data.values():
                if isinstance(value, str):
                    assert "\x00" not in value, type(form).__name__


@FUZZ
@given(text=any_text)
@example(text="Has a dog\x00")
@example(text="Has a dog \ud800")
def test_a_memory_correction_is_clean_text_or_refused(text: str) -> None:
    form = MemoryCorrectionForm({"text": text})
    if form.is_valid():
        cleaned = form.cleaned_data["text"]
        assert cleaned.strip() and "\x00" not in cleaned
        cleaned.encode("utf-8")
    else:
        assert form.errors["text"]


score = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-100, 100)


@given(scores=st.fixed_dictionaries({name: score for name, _ in ITEMS}))
@example(scores={name: 10 for name, _ in ITEMS})
@example(scores={name: math.nan for name, _ in ITEMS})
def test_rating_from_keeps_items_in_0_10_or_refuses(scores: dict[str, float]) -> None:
    inside = all(0.0 <= float(v) <= 10.0 for v in scores.values())
    if inside:
        rating = rating_from(scores)
        assert rating is not None and 0.0 <= rating.normalised() <= 1.0
    else:
        with pytest.raises(ValueError, match=r"\[0, 10\]"):
            rating_from(scores)


@given(data=posts)
def test_the_rating_form_gives_rating_from_only_valid_ratings(data: dict[str, Any]) -> None:
    form = _forms(data)[3]
    if form.is_valid():
        rating = rating_from(form.rating())  # never raises on what the form accepted
        assert rating is None or 0.0 <= rating.normalised() <= 1.0


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["Has a cat\x00", "  ", "x" * 2001])
def test_the_memory_page_refuses_unstorable_corrections_with_a_message(
    client: Any, text: str
) -> None:
    from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents

    profile = ClientProfileFactory()
    grant_all_consents(profile)
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Has a dog", origin="counselor"
    )
    login(client, profile.user)
    url = reverse("correct_memory", args=[item.pk])
    response = client.post(url, {"text": text}, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "error" in page and "Traceback" not in page
    assert not MemoryItem.objects.filter(supersedes=item).exists()
    # A lone surrogate cannot travel as UTF-8: its bytes arrive as U+FFFD, stored cleanly.
    body = "text=Has+a+cat+%ED%A0%80"
    response = client.post(url, body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 302
    for stored in MemoryItem.objects.filter(client=profile.user).values_list("text", flat=True):
        stored.encode("utf-8")
