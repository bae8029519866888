"""Refusals at the Django admin, logged like every other refusal (``psyevo.security``).

Django sends a logged-in non-admin to the admin's log-in page, which answers 200 ("you
are not authorized"); here that is a plain 403 with a log line, as on every other page.
Refusals inside the admin (a read-only model, a model that is not registered) get a log
line too, so every denied request leaves a trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from webapp.lib.access import deny

security_log = logging.getLogger("psyevo.security")


def _admin_prefix() -> str:
    return reverse("admin:index")


class AdminGateMiddleware:
    """Only active admins reach the Django admin; everyone else is refused and logged."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(_admin_prefix()):
            user = getattr(request, "user", None)
            if user is not None and user.is_authenticated:
                if not (user.is_active and user.is_staff):
                    raise deny(request, "not an admin (Django admin)")
            elif request.path != reverse("admin:login"):
                security_log.info("login required path=%s", request.path)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        if isinstance(exception, PermissionDenied | Http404) and request.path.startswith(
            _admin_prefix()
        ):
            user = getattr(request, "user", None)
            who = user.get_username() if user is not None and user.is_authenticated else "anon"
            security_log.warning(
                "denied user=%s path=%s method=%s reason=%s",
                who, request.path, request.method, type(exception).__name__,
            )  # fmt: skip
