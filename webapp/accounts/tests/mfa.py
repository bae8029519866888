"""How a test logs a clinician or admin in when MFA is required.

``PSYEVO_REQUIRE_MFA`` is off under pytest unless a test turns it on, so ``force_login`` is
enough for most tests. A test that turns it on logs staff in with :func:`login_verified`
(HTTP) or :func:`verified_session_cookie` (websockets).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp.accounts.models import User


def confirmed_device(user: User) -> TOTPDevice:
    return TOTPDevice.objects.create(user=user, name="test phone", confirmed=True)


def current_code(device: TOTPDevice) -> str:
    """The code the user's authenticator app would show now."""
    code = totp(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return str(code).zfill(device.digits)


def login_verified(client: Client, user: User) -> TOTPDevice:
    """``force_login`` plus a verified TOTP device in the session."""
    device = TOTPDevice.objects.filter(user=user, confirmed=True).first() or confirmed_device(user)
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session.save()
    return device


def verified_session_cookie(user: User, *, verified: bool = True) -> bytes:
    """A Cookie header for a logged-in session (with a verified device unless told not)."""
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    if verified:
        store[DEVICE_ID_SESSION_KEY] = confirmed_device(user).persistent_id
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}".encode()
