from __future__ import annotations

import logging

import pytest
from django.urls import reverse

from webapp.accounts.tests.factories import (
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
    UserFactory,
    grant_all_consents,
)

pytestmark = pytest.mark.django_db

PAGES = {"client": "my_sessions", "clinician": "clinician_home", "admin": "admin_home"}


def make(role: str):  # type: ignore[no-untyped-def]
    if role == "client":  # one who has agreed to counseling (else home is "My choices")
        profile = ClientProfileFactory()
        grant_all_consents(profile)
        return profile.user
    return {"clinician": ClinicianFactory, "admin": AdminFactory}[role]()


@pytest.mark.parametrize("role", PAGES)
def test_it_sends_each_role_to_its_home(client, role):  # type: ignore[no-untyped-def]
    client.force_login(make(role))
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == reverse(PAGES[role])
    assert client.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("role", PAGES)
@pytest.mark.parametrize("page", PAGES.values())
def test_it_forbids_other_roles_pages(client, caplog, role, page):  # type: ignore[no-untyped-def]
    client.force_login(make(role))
    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        response = client.get(reverse(page))
    if PAGES[role] == page:
        assert response.status_code == 200
    else:
        assert response.status_code == 403
        assert any("denied" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("page", [*PAGES.values(), "consent"])
def test_it_sends_anonymous_users_to_login(client, page):  # type: ignore[no-untyped-def]
    response = client.get(reverse(page))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_lets_only_admins_into_the_django_admin(client):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    assert client.get("/admin/").status_code == 403  # logged in, not an admin: refused
    client.force_login(AdminFactory())
    assert client.get("/admin/").status_code == 200


def test_it_lists_only_the_clinicians_own_clients(client):  # type: ignore[no-untyped-def]
    mine = ClientProfileFactory(user=UserFactory(username="mine"))
    ClientProfileFactory(user=UserFactory(username="theirs"))
    client.force_login(mine.clinician)
    body = client.get(reverse("clinician_home")).content.decode()
    assert "mine" in body
    assert "theirs" not in body


def test_it_keeps_role_and_staff_flag_consistent():  # type: ignore[no-untyped-def]
    user = UserFactory(role="admin")
    assert user.is_staff
    user.role = "client"
    user.save()
    user.refresh_from_db()
    assert not user.is_staff and not user.is_superuser
