"""Which clinicians may oversee a session live: the assigned one, and a covering one.

An unacknowledged crisis flag is escalated to a second clinician when the assigned one
does not answer in time (:mod:`webapp.oversight.escalation`). The covering clinician must
be able to do what the assigned one could in that session: read it, join its socket,
pause the AI and write to the client. So the review page, the live page, the socket and
pause/resume all use these predicates.

The choice: the covering right is scoped to the session that holds the escalated flag,
as the review page always was. The clinician's other pages about the client stay closed.
The right does not lapse when the flag is acknowledged, because the covering clinician
may still be talking with the client then. Pausing the AI is set per client, so a
covering clinician may pause or resume only while the flagged session is open.
"""

from __future__ import annotations

from django.db.models import Q

from webapp.accounts.models import ClientProfile, User
from webapp.counseling.models import Session


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
