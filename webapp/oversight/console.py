"""Services behind the clinician console: who may see whom, a session's decisions,
outcome trends, and the per-client skill controls.

Views call these; they parse, authorise and render only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from counselor_engine.output_guard import GuardVerdict
from counselor_engine.skills import skills_for
from webapp.accounts.models import ClientProfile, ConsentPurpose, User
from webapp.counseling.models import Session, Turn
from webapp.learning.models import CandidateGroup, SkillDecision
from webapp.lib import audit, plots
from webapp.lib.access import overseen_sessions
from webapp.memory.models import MemoryItem
from webapp.oversight.models import ClientControl, SafetyFlag

security_log = logging.getLogger("psyevo.security")


class ControlError(ValueError):
    """Skill controls that cannot be saved; the message says why."""


# -- access ------------------------------------------------------------------------------
def record_denial(user: User, path: str, *, client_id: int | None = None, what: str = "") -> None:
    """A clinician asked for a client-specific page that is not theirs: a security log
    line and an audit event (subject: that client, when the id names one)."""
    security_log.warning(
        "denied user=%s path=%s client=%s %s (not assigned)", user.username, path, client_id, what
    )
    subject = User.objects.filter(pk=client_id).first() if client_id is not None else None
    audit.record(user, "access.denied", subject=subject, target=path[:128], reason="not assigned")


def review_consented(client: User) -> bool:
    """Whether the client consents to clinician review now (the latest record decides;
    none means no). Checked by every page that shows a clinician the client's words."""
    profile = ClientProfile.objects.filter(user=client).first()
    return profile is not None and profile.has_consent(ConsentPurpose.CLINICIAN_REVIEW)


def flagged_turns(session: Session) -> list[Turn]:
    """What a clinician may still see of a session whose client withdrew review: the
    turns that raised a safety flag, and nothing else."""
    ids = SafetyFlag.objects.filter(session=session).values("turn_id")
    return list(Turn.objects.filter(session=session, pk__in=ids).order_by("seq"))


def assigned_profile(clinician: User, client_id: int) -> ClientProfile | None:
    return (
        ClientProfile.objects.filter(user_id=client_id, clinician=clinician)
        .select_related("user")
        .first()
    )


def reviewable_session(clinician: User, pk: int) -> Session | None:
    """A session of an assigned client, or one holding a flag escalated to this clinician."""
    return (
        Session.objects.select_related("client", "course")
        .filter(overseen_sessions(clinician), pk=pk)
        .distinct()
        .first()
    )


# -- session review ----------------------------------------------------------------------
@dataclass
class SkillRow:
    skill: str
    name: str
    chosen: bool
    record: dict[str, float] | None  # None: the skill was excluded at the time (p = 0)


@dataclass
class CandidateRow:
    index: int
    text: str
    depth: int
    pointwise: float | None
    delivered: bool
    rejected: bool = False  # by the output guard: never delivered, never preferred
    rules: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class ReviewTurn:
    turn: Turn
    decision: SkillDecision | None = None
    skills: list[SkillRow] = field(default_factory=list)
    group: CandidateGroup | None = None
    candidates: list[CandidateRow] = field(default_factory=list)
    graph: str = ""
    outcome: float | None = None
    credit: float | None = None


def exchange_index(turns: Iterable[Turn]) -> dict[int, int]:
    """Turn pk -> index of its exchange in ``Session.outcome`` lists.

    The engine numbers exchanges as ``counseling.services.stored_turns`` rebuilds them: a
    reply (counselor or clinician) that follows a client turn; a client turn never
    answered is skipped. Turn outcomes and credit are aligned with that numbering.
    """
    index: dict[int, int] = {}
    pending = False
    for turn in turns:
        if turn.role == Turn.Role.CLIENT:
            pending = True
        elif turn.role in (Turn.Role.COUNSELOR, Turn.Role.CLINICIAN) and pending:
            index[turn.pk] = len(index)
            pending = False
    return index


def review(session: Session) -> list[ReviewTurn]:
    """Every turn of a session with, for counselor turns, the decision at the time, the
    candidates, the SOCA graph, the turn outcome and its credit."""
    turns = list(session.turns.select_related("decision", "group").order_by("seq"))
    exchanges = exchange_index(turns)
    outcome = session.outcome or {}
    outcomes, credits = outcome.get("turn_outcomes") or [], outcome.get("credit") or []
    skills = skills_for(session.course.modality)
    out = []
    for turn in turns:
        item = ReviewTurn(turn)
        k = exchanges.get(turn.pk)
        if k is not None:
            item.outcome = _at(outcomes, k)
            item.credit = _at(credits, k)
        item.decision = getattr(turn, "decision", None)
        if item.decision is not None:
            records: dict[str, Any] = item.decision.records or {}
            item.skills = [
                SkillRow(s.id, s.name, s.id == item.decision.chosen, records.get(s.id))
                for s in skills
            ]
        item.group = getattr(turn, "group", None)
        if item.group is not None:
            item.candidates, item.graph = _candidates(item.group)
        out.append(item)
    return out


def _at(values: list[Any], k: int) -> float | None:
    return float(values[k]) if k < len(values) and values[k] is not None else None


def _candidates(group: CandidateGroup) -> tuple[list[CandidateRow], str]:
    texts = [str(t) for t in group.candidates or []]
    depths = [int(d) for d in group.depths or []]
    pointwise = list(group.pointwise or [])
    verdicts = [GuardVerdict.from_dict(v) for v in group.guard or [] if isinstance(v, dict)]
    rows = []
    for i, text in enumerate(texts):
        verdict = verdicts[i] if i < len(verdicts) else None
        rejected = verdict is not None and not verdict.admitted
        rows.append(
            CandidateRow(
                i,
                text,
                depths[i] if i < len(depths) else 0,
                pointwise[i] if i < len(pointwise) else None,
                i == group.delivered,
                rejected,
                verdict.rules if rejected and verdict else (),
                verdict.reason if rejected and verdict else "",
            )
        )
    rejected = sum(r.rejected for r in rows)
    caption = f"Preference graph of {len(texts)} candidates, {len(group.edges or [])} edges; " + (
        f"candidate {group.delivered + 1} delivered"
        if group.delivered is not None
        else "none delivered (the output guard's fallback was sent)"
    )
    if rejected:
        caption += f"; {rejected} rejected by the output guard"
    delivered = group.delivered if group.delivered is not None else -1
    graph = plots.soca_graph(
        len(texts), group.edges or [], depths, delivered, caption, uid=group.pk
    )
    return rows, graph


# -- outcome trends ------------------------------------------------------------------------
TREND_WINDOW = 3


def is_falling(rewards: list[float]) -> bool:
    """ "Falls over 3 sessions": the session reward strictly decreased across the client's
    last three ended sessions that have a reward (r1 > r2 > r3); fewer than three: no."""
    if len(rewards) < TREND_WINDOW:
        return False
    a, b, c = rewards[-TREND_WINDOW:]
    return a > b > c


@dataclass
class Trend:
    sessions: list[Session]
    falling: bool

    @property
    def rewards(self) -> list[float]:
        return [s.session_reward for s in self.sessions if s.session_reward is not None]


def ended_sessions(client: User) -> list[Session]:
    return list(
        Session.objects.filter(client=client, status=Session.Status.ENDED)
        .select_related("course")
        .order_by("ended_at", "id")
    )


def outcome_trend(client: User) -> Trend:
    sessions = ended_sessions(client)
    rewards = [s.session_reward for s in sessions if s.session_reward is not None]
    return Trend(sessions, is_falling(rewards))


def trend_plot(client: User, trend: Trend) -> plots.Plot | None:
    if not trend.sessions:
        return None
    last = trend.sessions[-1]

    def build() -> str:
        return plots.outcome_trend(
            [str(n) for n in range(1, len(trend.sessions) + 1)],
            [s.session_reward for s in trend.sessions],
            [(s.rating or {}).get("overall") for s in trend.sessions],
            trend.falling,
        )

    stamp = last.ended_at.timestamp() if last.ended_at else 0
    svg = plots.cached_svg(("trend", client.pk, last.pk, stamp, len(trend.sessions)), build)
    return plots.as_plot(
        svg, "Session reward and overall rating per ended session; the table below has the values."
    )


def falling_clients(client_ids: Iterable[int]) -> dict[int, list[float]]:
    """Client id -> the last three rewards, for each client whose trend is falling."""
    rewards: dict[int, list[float]] = {}
    for client_id, reward in (
        Session.objects.filter(
            client_id__in=list(client_ids),
            status=Session.Status.ENDED,
            session_reward__isnull=False,
        )
        .order_by("ended_at", "id")
        .values_list("client_id", "session_reward")
    ):
        rewards.setdefault(client_id, []).append(float(reward or 0.0))
    return {c: r[-TREND_WINDOW:] for c, r in rewards.items() if is_falling(r)}


def escalated_to(clinician: User) -> list[SafetyFlag]:
    """Open flags of other clinicians' clients that were escalated to this clinician."""
    return list(
        SafetyFlag.objects.filter(escalated_to=clinician, acknowledged_at__isnull=True)
        .exclude(client__client_profile__clinician=clinician)
        .select_related("client")
        .order_by("-created_at")[:50]
    )


# -- skill controls ------------------------------------------------------------------------
def validate_controls(modality: str, pinned: str, excluded: Iterable[str]) -> tuple[str, list[str]]:
    """The rules the form and any other caller share: only the modality's skills, not
    all of them excluded, and never a pinned skill that is excluded."""
    valid = [s.id for s in skills_for(modality)]
    excluded = sorted(set(excluded))
    unknown = [s for s in [*excluded, pinned] if s and s not in valid]
    if unknown:
        raise ControlError(f"{', '.join(unknown)} is not a skill of this client's modality.")
    if len(excluded) >= len(valid):
        raise ControlError("At least one skill must stay available: you cannot exclude them all.")
    if pinned and pinned in excluded:
        raise ControlError(f"{pinned} cannot be pinned and excluded at once.")
    return pinned, excluded


def set_skill_controls(
    clinician: User, client: User, modality: str, pinned: str, excluded: Iterable[str]
) -> ClientControl:
    """Save a client's pinned and excluded skills (audited, with before and after). The
    engine reads them fresh when it next builds the client's state."""
    pinned, excluded_list = validate_controls(modality, pinned, excluded)
    with transaction.atomic():
        control, _ = ClientControl.objects.select_for_update().get_or_create(client=client)
        before = {"pinned": control.pinned_skill, "excluded": sorted(control.excluded_skills)}
        control.pinned_skill = pinned
        control.excluded_skills = excluded_list
        control.save(update_fields=["pinned_skill", "excluded_skills", "updated_at"])
        audit.record(
            clinician,
            "skill_control.change",
            subject=client,
            target=f"client:{client.pk}",
            before=before,
            after={"pinned": pinned, "excluded": excluded_list},
        )
    return control


def memory_chains(client: User) -> list[list[Any]]:
    """The client's memory as chains, newest first: each chain runs from the current (or
    retired) item back through every item it superseded, so the source stays visible."""
    items = list(
        MemoryItem.objects.filter(client=client)
        .select_related("source_session", "created_by", "retired_by")
        .order_by("created_at", "id")
    )
    by_id = {m.pk: m for m in items}
    superseded = {m.supersedes_id for m in items if m.supersedes_id}
    chains = []
    for head in reversed(items):
        if head.pk in superseded:
            continue
        chain, current = [head], head
        while current.supersedes_id and current.supersedes_id in by_id:
            current = by_id[current.supersedes_id]
            chain.append(current)
        chains.append(chain)
    return chains
