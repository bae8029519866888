from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import reverse

from webapp.accounts.tests.factories import PASSWORD, ClinicianFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_it_shows_the_labelled_login_form(client):  # type: ignore[no-untyped-def]
    body = client.get(reverse("login")).content.decode()
    assert ">Username</label>" in body
    assert ">Password</label>" in body
    assert ">Log in</button>" in body


def test_it_logs_in_and_lands_on_the_role_home(client):  # type: ignore[no-untyped-def]
    user = ClinicianFactory()
    response = client.post(reverse("login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.get("/", follow=True).request["PATH_INFO"] == reverse("clinician_home")


def test_it_answers_wrong_credentials_with_a_form_error(client):  # type: ignore[no-untyped-def]
    user = UserFactory()
    response = client.post(reverse("login"), {"username": user.username, "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


@override_settings(AXES_FAILURE_LIMIT=3)
def test_it_locks_the_account_after_repeated_failures(client):  # type: ignore[no-untyped-def]
    user = UserFactory()
    for _ in range(3):
        client.post(reverse("login"), {"username": user.username, "password": "wrong"})
    response = client.post(reverse("login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed log-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_logs_out_only_by_post(client):  # type: ignore[no-untyped-def]
    client.force_login(UserFactory())
    assert client.get(reverse("logout")).status_code == 405
    assert client.post(reverse("logout")).status_code == 302
    assert "_auth_user_id" not in client.session


@override_settings(STAFF_IDLE_TIMEOUT_SECONDS=60)
def test_it_logs_idle_staff_out(client, monkeypatch):  # type: ignore[no-untyped-def]
    import webapp.accounts.middleware as middleware

    clock = [1_000_000.0]
    monkeypatch.setattr(middleware.time, "time", lambda: clock[0])
    client.force_login(ClinicianFactory())
    assert client.get(reverse("clinician_home")).status_code == 200
    clock[0] += 61
    response = client.get(reverse("clinician_home"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert "_auth_user_id" not in client.session


@override_settings(STAFF_IDLE_TIMEOUT_SECONDS=60)
def test_it_keeps_clients_logged_in_past_the_staff_idle_limit(client, monkeypatch):  # type: ignore[no-untyped-def]
    import webapp.accounts.middleware as middleware

    clock = [1_000_000.0]
    monkeypatch.setattr(middleware.time, "time", lambda: clock[0])
    client.force_login(UserFactory())
    client.get("/")
    clock[0] += 3600
    assert client.get(reverse("my_sessions")).status_code == 200
