"""Enrolling a TOTP device and verifying a log-in with it (clinicians and admins)."""

from __future__ import annotations

import base64
import logging
from typing import cast
from urllib.parse import urlencode

import segno
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp.accounts.forms import TokenForm
from webapp.accounts.mfa import STAFF_ROLES, confirmed_device
from webapp.accounts.models import User
from webapp.lib import audit
from webapp.lib.access import same_site_path

security_log = logging.getLogger("psyevo.security")


def _user(request: HttpRequest) -> User:
    return cast(User, request.user)  # the views are behind login_required


def _next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    return same_site_path(target) or "/"


def _step(name: str, request: HttpRequest) -> str:
    return f"{reverse(name)}?{urlencode({'next': _next(request)})}"


def _staff_only(request: HttpRequest) -> None:
    # Clients are not asked for a second factor; the pages do not exist for them.
    if getattr(request.user, "role", "") not in STAFF_ROLES:
        raise Http404


def _failed(request: HttpRequest, action: str, reason: str) -> None:
    security_log.warning("%s user=%s reason=%s", action, request.user.username, reason)
    audit.record(_user(request), action, target=f"user:{request.user.pk}", reason=reason)


@login_required
@require_http_methods(["GET", "POST"])
def mfa_setup(request: HttpRequest) -> HttpResponse:
    """Show a new device's QR code and secret; the first correct code confirms it."""
    _staff_only(request)
    if confirmed_device(request.user) is not None:
        # Replacing a device needs an admin (delete it in the Django admin): a stolen
        # password must not be enough to enroll the thief's phone.
        return redirect(_step("mfa_verify", request))
    device, _ = TOTPDevice.objects.get_or_create(
        user=request.user, confirmed=False, defaults={"name": "authenticator app"}
    )
    form = TokenForm(request.POST or None)
    if request.method == "POST":
        if form.is_valid() and device.verify_token(form.cleaned_data["token"]):
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            otp_login(request, device)
            audit.record(_user(request), "mfa.enroll", target=f"user:{request.user.pk}")
            return redirect(_next(request))
        _failed(request, "mfa.enroll_failed", "wrong or malformed code")
        form.add_error(None, "That code did not match. Check the time on your phone and retry.")
    context = {
        "form": form,
        "qr": segno.make(device.config_url, error="m").svg_data_uri(scale=4, border=2),
        "secret": base64.b32encode(device.bin_key).decode("ascii"),
        "next": _next(request),
    }
    return render(request, "accounts/mfa_setup.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def mfa_verify(request: HttpRequest) -> HttpResponse:
    """The second step of a staff log-in. Repeated wrong codes are throttled by the device."""
    _staff_only(request)
    device = confirmed_device(request.user)
    if device is None:
        return redirect(_step("mfa_setup", request))
    form = TokenForm(request.POST or None)
    if request.method == "POST":
        allowed, _ = device.verify_is_allowed()
        if form.is_valid() and allowed and device.verify_token(form.cleaned_data["token"]):
            otp_login(request, device)
            audit.record(_user(request), "mfa.verify", target=f"user:{request.user.pk}")
            return redirect(_next(request))
        reason = "throttled" if not allowed else "wrong or malformed code"
        _failed(request, "mfa.verify_failed", reason)
        form.add_error(
            None,
            "Too many wrong codes: wait a little and retry."
            if not allowed
            else "That code did not match. Try the current code.",
        )
    return render(request, "accounts/mfa_verify.html", {"form": form, "next": _next(request)})
