"""Session lifecycle on PostgreSQL: start, append turns, rebuild engine state, finish.

Transports (the consumer, views) call these; they hold no state of their own. Every
write that can race is serialised on the session row (``select_for_update``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Coalesce
from django.utils import timezone

from counselor_engine.counselor import (
    CandidateGroupRecord,
    ClientState,
    SessionOutcome,
    SessionRating,
    TurnRecord,
)
from counselor_engine.hbsp import Decision, SkillPosterior
from counselor_engine.safety import SafetyAssessment
from webapp.accounts.models import ClientProfile, ConsentPurpose, User
from webapp.counseling.models import Course, Session, Turn
from webapp.learning import schedule
from webapp.learning.models import (
    CandidateGroup,
    PosteriorCell,
    PosteriorUpdate,
    SkillDecision,
)
from webapp.learning.services import active_version
from webapp.lib.access import overseen_sessions
from webapp.memory import services as memory_services
from webapp.oversight import alerts
from webapp.oversight.models import ClientControl

log = logging.getLogger(__name__)


class SessionError(Exception):
    """A session request that cannot be honoured; ``code`` is shown to the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def open_session_for(client: User) -> Session | None:
    return Session.objects.filter(client=client, status=Session.Status.OPEN).first()


@transaction.atomic
def start_session(client: User) -> Session:
    """Resume the client's open session, or start the next one of their course.

    The adapter version active NOW is pinned for the whole session (paper Alg. 1 l. 4).
    """
    profile = ClientProfile.objects.select_for_update().filter(user=client).first()
    if profile is None:
        raise SessionError("no_profile", "Your account is not set up for counseling yet.")
    if not profile.has_consent(ConsentPurpose.COUNSELING):
        raise SessionError("no_consent", "Please agree to counseling on the My choices page first.")
    existing = open_session_for(client)
    if existing is not None:
        return existing
    course = Course.objects.filter(client=client, status=Course.Status.ACTIVE).first()
    if course is None:
        course = Course.objects.create(
            client=client,
            modality=profile.modality,
            planned_sessions=settings.PSYEVO_PLANNED_SESSIONS,
        )
    index = course.sessions.count()
    return Session.objects.create(
        course=course,
        client=client,
        index=index,
        adapter_version=active_version(),
        mode=settings.PSYEVO_MODE,
    )


def lock_session(session_id: int) -> Session:
    return Session.objects.select_for_update().get(pk=session_id)


def _next_seq(session: Session) -> int:
    last = session.turns.aggregate(m=Max("seq"))["m"]
    return 0 if last is None else last + 1


def append_turn(
    session_id: int,
    role: str,
    text: str,
    *,
    author: User | None = None,
    client_msg_id: str = "",
    safety_level: str = "none",
    even_if_ended: bool = False,
) -> tuple[Turn, bool]:
    """Append one turn; returns (turn, created). A repeated ``client_msg_id`` (a resend
    after a reconnect) returns the stored turn instead of a duplicate. ``even_if_ended``:
    a crisis, kept (with its safe reply and flag) whatever the session's state."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.status != Session.Status.OPEN and not even_if_ended:
            raise SessionError("session_closed", "This session has ended.")
        if client_msg_id:
            found = session.turns.filter(client_msg_id=client_msg_id).first()
            if found is not None:
                return found, False
        turn = Turn.objects.create(
            session=session,
            seq=_next_seq(session),
            role=role,
            text=text,
            author=author,
            client_msg_id=client_msg_id,
            safety_level=safety_level,
        )
        return turn, True


class Superseded(Exception):
    """A reply whose client turn another reply already covers: a crisis answered later
    with the safe reply, or another tab's writer answered it first. It is not stored."""


def _frontier(session: Session) -> int:
    """The seq up to which every client turn has been answered (-1: none).

    A reply covers its own message and every earlier one (a crisis' safe reply supersedes
    the messages before it); a clinician turn, and a reply stored before replies named
    their message, cover everything before them."""
    last = session.turns.exclude(role=Turn.Role.CLIENT).aggregate(
        m=Max(Coalesce("in_reply_to", "seq"))
    )["m"]
    return -1 if last is None else int(last)


def open_client_turns(session_id: int) -> list[Turn]:
    """The client turns still waiting for a reply, oldest first (answered in this order);
    none once the session is no longer open."""
    session = Session.objects.get(pk=session_id)
    if session.status != Session.Status.OPEN:
        return []
    return list(
        session.turns.filter(role=Turn.Role.CLIENT, seq__gt=_frontier(session)).order_by("seq")
    )


def _is_simulated(client: User) -> bool:
    return ClientProfile.objects.filter(user=client, simulated=True).exists()


def store_client_message(
    session_id: int,
    text: str,
    *,
    author: User | None,
    client_msg_id: str,
    assessment: SafetyAssessment,
) -> tuple[Turn, bool, list[Callable[[], None]]]:
    """Store a client message (not a crisis: see :func:`record_safe_reply`) with its
    safety level; a concern raises its flag in the same transaction. Returns the turn,
    whether it is new, and the flag's notification steps to run after the commit."""
    with transaction.atomic():
        turn, created = append_turn(
            session_id,
            Turn.Role.CLIENT,
            text,
            author=author,
            client_msg_id=client_msg_id,
            safety_level=assessment.level,
        )
        dispatch: list[Callable[[], None]] = []
        if created and assessment.level != "none" and not _is_simulated(turn.session.client):
            _, dispatch = alerts.store_flag(turn.session, turn, assessment)
        return turn, created, dispatch


@dataclass(frozen=True)
class SafeTurn:
    message: Turn
    message_created: bool
    reply: Turn
    reply_created: bool
    dispatch: list[Callable[[], None]]


def record_safe_reply(
    session_id: int,
    text: str,
    *,
    author: User | None,
    client_msg_id: str,
    assessment: SafetyAssessment,
    reply: str,
) -> SafeTurn:
    """A crisis in ONE transaction: the client's message, the safe reply, the crisis
    flag and its email outbox row. No crash can leave a safe reply without its flag.
    Also in a session that has ended (a page left open after the end, or reconnected to
    it): the clinician must hear of it; an ended session still takes no model reply and
    no evidence.

    Idempotent per ``client_msg_id``: a retry finds the stored message; a safe reply
    already stored is returned (and its flag raised if it is somehow missing, a row
    from before this rule), never a second one. Simulated clients get no flag."""
    with transaction.atomic():
        message, created = append_turn(
            session_id,
            Turn.Role.CLIENT,
            text,
            author=author,
            client_msg_id=client_msg_id,
            safety_level="crisis",
            even_if_ended=True,
        )
        session = lock_session(session_id)  # held already by append_turn's transaction
        answer = (
            session.turns.filter(in_reply_to=message.seq)
            .exclude(role=Turn.Role.CLIENT)
            .order_by("seq")
            .first()
        )
        made = answer is None
        if answer is None:
            answer = Turn.objects.create(
                session=session,
                seq=_next_seq(session),
                role=Turn.Role.COUNSELOR,
                text=reply,
                safety_level="crisis",
                in_reply_to=message.seq,
            )
        dispatch: list[Callable[[], None]] = []
        flagged = message.safety_flags.filter(level="crisis").exists()
        if not flagged and not _is_simulated(session.client):
            _, dispatch = alerts.store_flag(session, message, assessment)
        return SafeTurn(message, created, answer, made, dispatch)


@dataclass(frozen=True)
class StoredTurns:
    records: list[TurnRecord]
    unanswered: Turn | None  # a client turn with no reply yet (a retry path)


def _client_controls(client: User) -> tuple[str | None, frozenset[str]]:
    control = ClientControl.objects.filter(client=client).first()
    if control is None:
        return None, frozenset()
    return control.pinned_skill or None, frozenset(control.excluded_skills)


def load_posterior(client: User) -> SkillPosterior:
    posterior = SkillPosterior()
    cells = PosteriorCell.objects.filter(client=client)
    return SkillPosterior.from_dict(
        {
            "format": 1,
            "prior_precision": posterior.prior_precision,
            "obs_variance": posterior.obs_variance,
            "cells": [
                {
                    "state": c.state_slot,
                    "skill": c.skill,
                    "mean": c.mean,
                    "precision": c.precision,
                    "n": c.n,
                }
                for c in cells
            ],
        }
    )


def client_state(session: Session) -> ClientState:
    """Everything the engine needs about the client, read fresh from PostgreSQL."""
    client = session.client
    pinned, excluded = _client_controls(client)
    history = list(
        Session.objects.filter(
            client=client, status=Session.Status.ENDED, session_reward__isnull=False
        )
        .exclude(pk=session.pk)
        .order_by("ended_at")
        .values_list("session_reward", flat=True)
    )
    return ClientState(
        client_id=str(client.pk),
        modality=session.course.modality,
        session_index=session.index,
        planned_sessions=session.course.planned_sessions,
        posterior=load_posterior(client),
        memory=memory_services.load_store(client),
        session_rewards=[float(r) for r in history],
        pinned_skill=pinned,
        excluded_skills=excluded,
    )


def stored_turns(session: Session) -> StoredTurns:
    """The session's exchanges as engine TurnRecords (client turn + its reply)."""
    records: list[TurnRecord] = []
    pending: Turn | None = None
    by_seq: dict[int, Turn] = {}
    turns = session.turns.select_related("decision").order_by("seq")
    for turn in turns:
        if turn.role == Turn.Role.CLIENT:
            # A client message that never got a reply (a backend failure, then the client
            # wrote again) stays in the transcript but not in the engine's view.
            pending = turn
            by_seq[turn.seq] = turn
        elif turn.role in (Turn.Role.COUNSELOR, Turn.Role.CLINICIAN):
            # A reply names its message: one sent while the previous reply was being
            # written sits between that reply and its own message.
            asked = by_seq.get(turn.in_reply_to) if turn.in_reply_to is not None else pending
            if asked is None:
                continue
            shared = None
            decision = getattr(turn, "decision", None)
            if decision is not None:
                shared = float(decision.records[decision.chosen]["shared_value"])
            records.append(
                TurnRecord(
                    index=len(records),
                    client_text=asked.text,
                    reply=turn.text,
                    state_slot=turn.state_slot or None,
                    skill=turn.skill or None,
                    shared_value=shared,
                    safety_level=asked.safety_level,
                    group=None,
                )
            )
            by_seq.pop(asked.seq, None)
            if pending is not None and pending.seq <= asked.seq:
                pending = None
    return StoredTurns(records, pending)


def record_counselor_turn(
    session_id: int,
    reply: str,
    *,
    decision: Decision | None,
    group: CandidateGroupRecord | None,
    safety_level: str,
    in_reply_to: int | None = None,
) -> Turn:
    """Commit the delivered turn, its decision and its candidate group in ONE transaction.

    Under the session's row lock, so it cannot interleave with the session's end or a
    crisis: an ENDED session takes no reply and no evidence (``session_closed``), and a
    reply to a message another reply already covers raises :class:`Superseded`."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.status != Session.Status.OPEN:
            raise SessionError("session_closed", "This session has ended.")
        if in_reply_to is not None and _frontier(session) >= in_reply_to:
            raise Superseded(f"turn {in_reply_to} of session {session_id} is already answered")
        turn = Turn.objects.create(
            session=session,
            seq=_next_seq(session),
            role=Turn.Role.COUNSELOR,
            text=reply,
            skill=decision.chosen if decision else "",
            state_slot=decision.state if decision else "",
            safety_level=safety_level,
            in_reply_to=in_reply_to,
        )
        if decision is not None:
            SkillDecision.objects.create(
                turn=turn,
                state_slot=decision.state,
                chosen=decision.chosen,
                pinned=decision.pinned,
                records=decision.to_dict()["records"],
            )
        if group is not None:
            _store_group(session, turn, group)
        return turn


def _store_group(session: Session, turn: Turn, group: CandidateGroupRecord) -> CandidateGroup:
    """Evidence enters the buffer only when admissible and the client consents to training."""
    profile = ClientProfile.objects.get(user=session.client)
    consented = profile.has_consent(ConsentPurpose.TRAINING)
    status = (
        CandidateGroup.Buffer.AVAILABLE
        if group.admissible and consented
        else CandidateGroup.Buffer.EXCLUDED
    )
    problem = group.problem if consented else (group.problem or "no training consent")
    return CandidateGroup.objects.create(
        turn=turn,
        session=session,
        client=session.client,
        modality=group.modality,
        adapter_version=session.adapter_version,
        group_key=group.group_id,
        mode=group.mode,
        state_slot=group.state_slot,
        skill=group.skill,
        prompt=group.prompt,
        candidates=group.candidates,
        judgments=group.judgments,
        support=group.support,
        edges=group.edges,
        pointwise=[p if p == p else None for p in group.pointwise],  # NaN is not JSON
        depths=group.depths,
        delivered=group.delivered,
        admissible=group.admissible,
        problem=problem[:200],
        beta=group.beta,
        edge_count=len(group.edges),
        search=group.search,
        guard=group.guard,
        buffer_status=status,
    )


def record_crisis(session_id: int, client_turn: Turn, assessment: SafetyAssessment) -> None:
    """Flag the message and alert the assigned clinician (live, and by email via outbox)."""
    alerts.raise_flag(session_id, client_turn, assessment)


def rating_from(data: dict[str, object] | None) -> SessionRating | None:
    if data is None:
        return None
    return SessionRating(
        **{k: float(data[k]) for k in ("relationship", "goals_and_topics", "approach", "overall")}
    )  # type: ignore[arg-type]


def finish_session(
    session_id: int, outcome: SessionOutcome, rating: SessionRating | None
) -> Session:
    """Persist the session end: rewards, credit, one audit row per posterior update,
    the memory recap, and the LiPO schedule (queued on commit when eligible).

    The engine already applied the H.7 skip rules (``outcome.evidence``): a skipped
    session brings no posterior updates, and its record (rule, outcome variance, judged
    turns) is kept in ``Session.outcome["evidence"]`` for the clinician review and the
    posterior inspector. A session reward that was never observed (no rating, nothing
    judged) is stored as None, so it joins no client's reward history."""
    with transaction.atomic():
        session = lock_session(session_id)
        if session.status != Session.Status.OPEN:
            raise SessionError("session_closed", "This session has already ended.")
        counselor_turns = list(
            session.turns.filter(role=Turn.Role.COUNSELOR).exclude(skill="").order_by("seq")
        )
        by_cell = {(t.state_slot, t.skill): t for t in counselor_turns}
        for update in outcome.posterior_updates:
            cell, _ = PosteriorCell.objects.select_for_update().get_or_create(
                client=session.client,
                state_slot=update.state,
                skill=update.skill,
                defaults={
                    "modality": session.course.modality,
                    "mean": update.mean_before,
                    "precision": update.precision_before,
                },
            )
            cell.mean, cell.precision, cell.n = update.mean_after, update.precision_after, update.n
            cell.save(update_fields=["mean", "precision", "n", "updated_at"])
            PosteriorUpdate.objects.create(
                cell=cell,
                session=session,
                turn=by_cell.get((update.state, update.skill)),
                mean_before=update.mean_before,
                precision_before=update.precision_before,
                mean_after=update.mean_after,
                precision_after=update.precision_after,
                residual=update.residual,
                credit=update.G,
                shared_value=update.shared_value,
            )
        memory_services.save_recap(session, outcome.recap)
        session.status = Session.Status.ENDED
        session.ended_at = timezone.now()
        session.rated = rating is not None
        session.rating = (
            None
            if rating is None
            else {
                "relationship": rating.relationship,
                "goals_and_topics": rating.goals_and_topics,
                "approach": rating.approach,
                "overall": rating.overall,
            }
        )
        session.internal_reward = outcome.internal_reward
        session.session_reward = outcome.session_reward if outcome.reward_observed else None
        session.projected_reward = outcome.projected_session_reward
        session.outcome = {
            "turn_outcomes": outcome.turn_outcomes,
            "credit": outcome.credit,
            "evidence": outcome.evidence.to_dict(),
        }
        session.save()
        course = session.course
        if session.index + 1 >= course.planned_sessions:
            course.status = Course.Status.COMPLETED
            course.save(update_fields=["status"])
        schedule.note_session_completed(session)
        return session


def client_may_open(user: User, session: Session) -> bool:
    return session.client_id == user.pk


def clinician_may_open(user: User, session: Session) -> bool:
    """Assigned to the client, or covering a crisis flag of this session (webapp.lib.access)."""
    return Session.objects.filter(overseen_sessions(user), pk=session.pk).exists()
