"""Whether a session's evidence moved the learning state: the H.7 skip record, for the
clinician session review and the admin posterior inspector.

``counseling.services.finish_session`` stores the engine's record
(``counselor_engine.soca.check_session_evidence``) in ``Session.outcome["evidence"]``;
sessions that ended before the record existed have none and show nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count

from counselor_engine.soca import SKIP_ALL_TIED, SKIP_JUDGE_FAILED, SKIP_TOO_FEW_JUDGED
from webapp.accounts.models import User
from webapp.counseling.models import Session

REASONS = {
    SKIP_JUDGE_FAILED: "the internal judge failed at session end",
    SKIP_TOO_FEW_JUDGED: "fewer than two turns had a judged outcome",
    SKIP_ALL_TIED: "every judged turn outcome was equal, so they carry no order (PsyEvo H.7)",
}


@dataclass(frozen=True)
class EvidenceNote:
    session: Session
    judged: int
    variance: float | None
    skip: str
    updates: int = 0

    @property
    def skipped(self) -> bool:
        return bool(self.skip)

    @property
    def reason(self) -> str:
        return REASONS.get(self.skip, self.skip)


def note(session: Session, updates: int = 0) -> EvidenceNote | None:
    """The session's record, or None when it has none (open, or ended before records)."""
    record = (session.outcome or {}).get("evidence")
    if not isinstance(record, dict):
        return None
    variance = record.get("variance")
    return EvidenceNote(
        session,
        int(record.get("judged") or 0),
        float(variance) if isinstance(variance, int | float) else None,
        str(record.get("skip") or ""),
        updates,
    )


def client_notes(client: User) -> list[EvidenceNote]:
    """Every ended session of ``client`` that has a record, oldest first, with how many
    posterior updates it made."""
    sessions = (
        Session.objects.filter(client=client, status=Session.Status.ENDED)
        .annotate(updates=Count("posterior_updates"))
        .order_by("ended_at", "id")
    )
    notes = [note(s, s.updates) for s in sessions]
    return [n for n in notes if n is not None]
