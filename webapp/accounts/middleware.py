"""Log clinicians and admins out after an idle period.

They can read other people's transcripts, so an unattended logged-in browser is a risk;
clients keep the ordinary session lifetime.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse

LAST_SEEN_KEY = "psyevo_last_seen"


class StaffIdleTimeoutMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if (
            user is not None
            and user.is_authenticated
            and getattr(user, "role", "")
            in (
                "clinician",
                "admin",
            )
        ):
            now = time.time()
            last_seen = request.session.get(LAST_SEEN_KEY)
            if (
                last_seen is not None
                and now - float(last_seen) > settings.STAFF_IDLE_TIMEOUT_SECONDS
            ):
                logout(request)
                messages.info(request, "You were logged out after a period of inactivity.")
                return redirect_to_login(request.get_full_path())
            request.session[LAST_SEEN_KEY] = now
        return self.get_response(request)
