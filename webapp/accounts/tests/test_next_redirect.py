"""``next`` only ever leads to a path on this site (issue 18, item 5): after log-in, after
the MFA steps, and after the pause / resume buttons (a POST field)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.accounts.tests.factories import PASSWORD, UserFactory
from webapp.lib.access import same_site_path
from webapp.oversight.tests.helpers import client_profile

OFFSITE = [
    "https://evil.example/",
    "http://evil.example",
    "//evil.example/path",
    "/\\evil.example",
    "\\\\evil.example",
    "/ok\\..\\evil",
    "javascript:alert(1)",
    "evil.example",
    "/a\nLocation: https://evil.example",
    "",
]


@pytest.mark.parametrize("target", OFFSITE)
def test_same_site_path_refuses_anything_but_a_local_path(target: str) -> None:
    assert same_site_path(target) == ""


@pytest.mark.parametrize("target", ["/", "/memory/", "/sessions/3/?tab=review#t-2"])
def test_same_site_path_keeps_a_local_path(target: str) -> None:
    assert same_site_path(target) == target


@pytest.mark.django_db
@pytest.mark.parametrize("target", OFFSITE[:6])
def test_login_never_redirects_off_site(client, target: str) -> None:  # type: ignore[no-untyped-def]
    user = UserFactory()
    response = client.post(
        reverse("login") + "?next=/memory/",
        {"username": user.username, "password": PASSWORD, "next": target},
    )
    assert response.status_code == 302
    location = response["Location"]
    assert location.startswith("/") and not location.startswith(("//", "/\\"))
    assert "evil" not in location


@pytest.mark.django_db
def test_login_follows_a_local_next(client) -> None:  # type: ignore[no-untyped-def]
    user = UserFactory()
    response = client.post(
        reverse("login"), {"username": user.username, "password": PASSWORD, "next": "/memory/"}
    )
    assert response["Location"] == "/memory/"


@pytest.mark.django_db
def test_the_pause_button_never_redirects_off_site(client) -> None:  # type: ignore[no-untyped-def]
    profile = client_profile()
    client.force_login(profile.clinician)
    url = reverse("pause_ai", args=[profile.user_id])

    response = client.post(url, {"next": "https://evil.example/phish"})
    assert response["Location"] == reverse("clinician_home")
    response = client.post(reverse("resume_ai", args=[profile.user_id]), {"next": "//evil.example"})
    assert response["Location"] == reverse("clinician_home")
    response = client.post(url, {"next": "/oversight/sessions/1/"})
    assert response["Location"] == "/oversight/sessions/1/"
