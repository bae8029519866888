"""Is the Django session behind a long-lived socket still a valid log-in?

HTTP requests are checked on every request by Django's auth and our idle-timeout
middleware; a websocket is authenticated once, at connect. Its consumers call
:func:`login_still_valid` on a timer (``WS_REAUTH_SECONDS``) and on every message, so a
socket closes soon after whatever would log the same browser out over HTTP:

1. logout (the session row is deleted) or session expiry (the row outlives its
   ``expire_date`` until ``clearsessions`` runs, so the row's existence is not enough);
2. a password change (the session's auth hash no longer matches the user's);
3. the staff idle timeout (clinicians and admins, ``STAFF_IDLE_TIMEOUT_SECONDS``), counted
   from the last HTTP request or socket message (``touch``: a clinician writing in a live
   session is not idle).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.utils.crypto import constant_time_compare

from webapp.accounts.middleware import LAST_SEEN_KEY
from webapp.accounts.models import User

STAFF_ROLES = ("clinician", "admin")


def login_still_valid(session_key: str | None, user: User, *, touch: bool = False) -> bool:
    """True while ``session_key`` is an unexpired log-in of ``user`` with the password the
    user has now, and (staff) not idle past the limit; ``touch`` records activity."""
    if not session_key:
        return False
    store = SessionStore(session_key=session_key)
    data = store.load()  # {} for a missing or expired session
    if not data or str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    if not constant_time_compare(str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash()):
        return False  # the password changed (Django ends the other sessions the same way)
    if user.role in STAFF_ROLES:
        now = time.time()
        last_seen = data.get(LAST_SEEN_KEY)
        if last_seen is not None and now - float(last_seen) > settings.STAFF_IDLE_TIMEOUT_SECONDS:
            return False
        if touch:
            store[LAST_SEEN_KEY] = now
            store.save()
    return True
