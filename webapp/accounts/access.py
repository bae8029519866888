"""Role checks shared by every app's views, with a security log line for each denial."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

security_log = logging.getLogger("psyevo.security")


def same_site_path(target: object) -> str:
    """``target`` when it is a path on this site ("/..."), else "".

    Every ``next`` parameter goes through here before a redirect: an absolute URL, a
    scheme-relative ``//host`` or its backslash forms (browsers read ``/\\host`` as
    ``//host``) and anything with control characters are refused, so no link can send
    a user who just logged in or pressed a button to another site."""
    if not isinstance(target, str) or not target.startswith("/"):
        return ""
    if target.startswith(("//", "/\\")) or "\\" in target:
        return ""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return ""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return ""
    return target


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
