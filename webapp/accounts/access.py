"""Role checks shared by every app's views, with a security log line for each denial."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

security_log = logging.getLogger("psyevo.security")


def deny(request: HttpRequest, reason: str) -> PermissionDenied:
    """Log a refused access and return the exception to raise (403)."""
    user = getattr(request, "user", None)
    who = getattr(user, "username", "anonymous") if user and user.is_authenticated else "anonymous"
    security_log.warning("denied user=%s path=%s reason=%s", who, request.path, reason)
    return PermissionDenied(reason)


def role_required(
    *roles: str,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Anonymous users go to the login page; a logged-in user of another role gets 403."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                security_log.info("login required path=%s", request.path)
                return redirect_to_login(request.get_full_path())
            if getattr(request.user, "role", None) not in roles:
                raise deny(request, f"role {getattr(request.user, 'role', '?')} not in {roles}")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
