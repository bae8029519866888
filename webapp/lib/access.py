"""Who may do what: one home for access decisions shared by every app.

Role gates for views log each denial to the security log; ``same_site_path`` keeps every
redirect on this site; a client without counseling consent is sent to "My choices".

The oversight predicates say which clinicians may oversee a session live: the assigned
one, and a covering one. An unacknowledged crisis flag is escalated to a second clinician
when the assigned one does not answer in time (:mod:`webapp.oversight.escalation`). The
covering clinician must be able to do what the assigned one could in that session: read
it, join its socket, pause the AI and write to the client. So the review page, the live
page, the socket and pause/resume all use these predicates.

The choice: the covering right is scoped to the session that holds the escalated flag,
as the review page always was. The clinician's other pages about the client stay closed.
The right does not lapse when the flag is acknowledged, because the covering clinician
may still be talking with the client then. Pausing the AI is set per client, so a
covering clinician may pause or resume only while the flagged session is open.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from webapp.accounts.models import ClientProfile, ConsentPurpose, User
from webapp.counseling.models import Session

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


# Why a client is on "My choices" before they can talk with the counselor: one sentence,
# shown above the form when they arrive from the home page or from "Start session".
NEEDS_COUNSELING_CONSENT = "needs-counseling"


def consent_needed_redirect() -> HttpResponse:
    return redirect(f"{reverse('consent')}?why={NEEDS_COUNSELING_CONSENT}")


def lacks_counseling_consent(user: User) -> bool:
    """A client with a profile whose latest counseling choice is not "yes" (or who never
    made one). A client without a profile is the clinic's to set up, not a consent question."""
    profile = ClientProfile.objects.filter(user=user).first()
    return profile is not None and not profile.has_consent(ConsentPurpose.COUNSELING)


def overseen_sessions(clinician: User) -> Q:
    """Filter for ``Session`` rows this clinician may oversee (use with ``.distinct()``)."""
    return Q(client__client_profile__clinician=clinician) | Q(safety_flags__escalated_to=clinician)


def pausable_profile(clinician: User, client_id: int) -> ClientProfile | None:
    """The client's profile when this clinician may pause or resume the AI for them:
    assigned, or covering an escalated flag of the client's open session."""
    return (
        ClientProfile.objects.filter(
            Q(clinician=clinician)
            | Q(
                user__sessions__status=Session.Status.OPEN,
                user__sessions__safety_flags__escalated_to=clinician,
            ),
            user_id=client_id,
        )
        .select_related("user")
        .distinct()
        .first()
    )
