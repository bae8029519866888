"""Clinicians and admins confirm each log-in with a TOTP code; clients are not asked."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp.accounts.tests.factories import PASSWORD, AdminFactory, ClinicianFactory, UserFactory
from webapp.accounts.tests.mfa import (
    confirmed_device,
    current_code,
    login_verified,
    verified_session_cookie,
)
from webapp.counseling.tests.helpers import end_refused
from webapp.oversight.models import AuditEvent


@pytest.fixture
def mfa_on(settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_REQUIRE_MFA = True
    return settings


def password_login(client: Client, user) -> None:  # type: ignore[no-untyped-def]
    response = client.post(reverse("login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302


def wrong_code(device: TOTPDevice) -> str:
    return "000000" if current_code(device) != "000000" else "111111"


@pytest.mark.django_db
def test_it_sends_a_clinician_without_a_device_to_enrollment_and_keeps_the_destination(
    client, mfa_on
):  # type: ignore[no-untyped-def]
    user = ClinicianFactory()
    password_login(client, user)
    response = client.get(reverse("clinician_home"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("mfa_setup"))
    assert unquote(response["Location"]).endswith("next=/clinician/")


@pytest.mark.django_db
def test_it_enrolls_a_device_from_the_qr_page_and_then_lets_the_clinician_in(client, mfa_on):  # type: ignore[no-untyped-def]
    user = ClinicianFactory()
    password_login(client, user)
    page = client.get(reverse("mfa_setup"), {"next": "/clinician/"}).content.decode()
    assert re.search(r'<img class="qr" src="data:image/svg\+xml', page)
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    secret = re.search(r'<code id="totp-secret">([A-Z2-7=]+)</code>', page).group(1)  # type: ignore[union-attr]
    assert len(secret) >= 32

    response = client.post(
        reverse("mfa_setup"), {"token": wrong_code(device), "next": "/clinician/"}
    )
    assert "That code did not match" in response.content.decode()
    assert AuditEvent.objects.filter(actor=user, action="mfa.enroll_failed").exists()
    device.refresh_from_db()
    assert not device.confirmed
    device.throttle_reset()

    response = client.post(
        reverse("mfa_setup"), {"token": current_code(device), "next": "/clinician/"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/clinician/"
    device.refresh_from_db()
    assert device.confirmed
    assert AuditEvent.objects.filter(actor=user, action="mfa.enroll").exists()
    assert client.get(reverse("clinician_home")).status_code == 200


@pytest.mark.django_db
def test_it_asks_an_enrolled_clinician_for_a_code_after_the_password(client, mfa_on, caplog):  # type: ignore[no-untyped-def]
    user = ClinicianFactory()
    device = confirmed_device(user)
    password_login(client, user)
    response = client.get(reverse("clinician_home"))
    assert response["Location"].startswith(reverse("mfa_verify"))

    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        response = client.post(
            reverse("mfa_verify"), {"token": wrong_code(device), "next": "/clinician/"}
        )
    assert "That code did not match" in response.content.decode()
    assert client.get(reverse("clinician_home")).status_code == 302
    event = AuditEvent.objects.get(actor=user, action="mfa.verify_failed")
    assert event.detail == {"reason": "wrong or malformed code"}
    assert any("mfa.verify_failed" in r.getMessage() for r in caplog.records)

    device.throttle_reset()
    response = client.post(
        reverse("mfa_verify"), {"token": current_code(device), "next": "/clinician/"}
    )
    assert response["Location"] == "/clinician/"
    assert client.get(reverse("clinician_home")).status_code == 200


@pytest.mark.django_db
def test_it_throttles_guessing(client, mfa_on):  # type: ignore[no-untyped-def]
    mfa_on.OTP_TOTP_THROTTLE_FACTOR = 3600  # the wait after a failure outlasts the test
    user = ClinicianFactory()
    device = confirmed_device(user)
    password_login(client, user)
    client.post(reverse("mfa_verify"), {"token": wrong_code(device)})
    response = client.post(reverse("mfa_verify"), {"token": current_code(device)})
    assert "Too many wrong codes" in response.content.decode()
    assert client.get(reverse("clinician_home")).status_code == 302
    reasons = list(
        AuditEvent.objects.filter(actor=user, action="mfa.verify_failed").values_list(
            "detail__reason", flat=True
        )
    )
    assert reasons == ["wrong or malformed code", "throttled"]


@pytest.mark.django_db
def test_a_password_alone_cannot_replace_an_enrolled_device(client, mfa_on):  # type: ignore[no-untyped-def]
    user = ClinicianFactory()
    confirmed_device(user)
    password_login(client, user)
    response = client.get(reverse("mfa_setup"))
    assert response["Location"].startswith(reverse("mfa_verify"))
    assert TOTPDevice.objects.filter(user=user).count() == 1


@pytest.mark.django_db
def test_the_django_admin_needs_a_verified_device(client, mfa_on):  # type: ignore[no-untyped-def]
    admin = AdminFactory()
    client.force_login(admin)
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("mfa_setup"))
    login_verified(client, admin)
    assert client.get("/admin/").status_code == 200


@pytest.mark.django_db
def test_htmx_requests_get_a_full_page_redirect(client, mfa_on):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    response = client.get(reverse("clinician_home"), headers={"HX-Request": "true"})
    assert response.status_code == 204
    assert response["HX-Redirect"].startswith(reverse("mfa_setup"))


@pytest.mark.django_db
def test_clients_are_not_asked_for_a_second_factor(client, mfa_on):  # type: ignore[no-untyped-def]
    user = UserFactory()
    password_login(client, user)
    assert client.get(reverse("my_sessions")).status_code == 200
    assert client.get(reverse("mfa_setup")).status_code == 404


@pytest.mark.django_db
def test_unverified_staff_can_still_log_out(client, mfa_on):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    assert client.post(reverse("logout")).status_code == 302
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_with_mfa_off_a_password_is_enough(client, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_REQUIRE_MFA = False
    password_login(client, ClinicianFactory())
    assert client.get(reverse("clinician_home")).status_code == 200


# --- websockets skip Django's middleware: the ASGI stack checks the device ----------------


def notifications(cookie: bytes) -> WebsocketCommunicator:
    from webapp.asgi import application

    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    return WebsocketCommunicator(application, "/ws/notifications/", headers=headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
@pytest.mark.parametrize("verified", [False, True])
async def test_staff_sockets_need_a_verified_session(mfa_on, verified):  # type: ignore[no-untyped-def]
    user = await sync_to_async(ClinicianFactory)()
    cookie = await sync_to_async(verified_session_cookie)(user, verified=verified)
    comm = notifications(cookie)
    connected, code = await comm.connect()
    assert connected is verified
    if verified:
        await comm.disconnect()
    else:
        assert code == 4401
        await end_refused(comm)
