"""Two-factor log-in (TOTP, django-otp) for clinicians and admins.

They read other people's transcripts, so a stolen password alone must not be enough. With
``PSYEVO_REQUIRE_MFA`` on, a clinician or admin whose session is not verified by a TOTP
device reaches only the enrollment or verification page (and log-out); the Django admin
and the staff websockets are covered too. Clients are not asked for a second factor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.plugins.otp_totp.models import TOTPDevice

security_log = logging.getLogger("psyevo.security")

STAFF_ROLES = ("clinician", "admin")


def needs_mfa(user: Any) -> bool:
    """True for a logged-in clinician or admin while MFA is required."""
    return bool(
        settings.PSYEVO_REQUIRE_MFA
        and user is not None
        and user.is_authenticated
        and (getattr(user, "role", "") in STAFF_ROLES or user.is_staff or user.is_superuser)
    )


def confirmed_device(user: Any) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).order_by("id").first()


def _open_paths() -> tuple[str, ...]:
    """What an unverified staff user may still reach: the two MFA steps and log-out."""
    return (reverse("mfa_setup"), reverse("mfa_verify"), reverse("logout"))


class MfaRequiredMiddleware:
    """Sends an unverified clinician or admin to verification (or enrollment, if they have
    no device yet), keeping where they were going in ``next``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if not needs_mfa(user) or user.is_verified():  # type: ignore[union-attr]
            return self.get_response(request)
        path = request.path
        if path in _open_paths() or path.startswith(settings.STATIC_URL) or path == "/healthz":
            return self.get_response(request)
        step = "mfa_verify" if confirmed_device(user) is not None else "mfa_setup"
        target = f"{reverse(step)}?{urlencode({'next': request.get_full_path()})}"
        if request.headers.get("HX-Request"):
            # htmx would swap the form page into a fragment: make the browser navigate.
            response = HttpResponse(status=204)
            response["HX-Redirect"] = target
            return response
        return HttpResponseRedirect(target)


@database_sync_to_async
def _session_verified(scope: dict[str, Any], user: Any) -> bool:
    session = scope.get("session")
    persistent_id = session.get(DEVICE_ID_SESSION_KEY) if session is not None else None
    if not persistent_id:
        return False
    device = TOTPDevice.from_persistent_id(persistent_id)
    return bool(
        device is not None
        and isinstance(device, TOTPDevice)
        and device.user_id == user.pk
        and device.confirmed
    )


class MfaScopeMiddleware(BaseMiddleware):
    """Websockets skip Django's middleware: an unverified clinician or admin is anonymous
    to the consumers (which then refuse the socket). Goes inside AuthMiddlewareStack."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user = scope.get("user")
        if needs_mfa(user) and not await _session_verified(scope, user):
            security_log.warning(
                "denied socket user=%s path=%s reason=mfa not verified",
                getattr(user, "username", "?"),
                scope.get("path", ""),
            )
            scope = dict(scope, user=AnonymousUser())
        return await super().__call__(scope, receive, send)
