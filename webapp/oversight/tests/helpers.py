"""Builders for console tests: sessions with decisions, candidate groups and posterior
updates written straight to PostgreSQL (fast; the socket path has its own tests)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from counselor_engine.hbsp import posterior_update
from counselor_engine.skills import PriorTable, skills_for
from webapp.accounts.models import ClientProfile
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling.models import Course, Session, Turn
from webapp.learning.models import CandidateGroup, PosteriorCell, PosteriorUpdate, SkillDecision

SLOT = "formulation/early/anxiety"
EDGES = [
    {"winner": 0, "loser": 1, "weight": 0.6},
    {"winner": 0, "loser": 2, "weight": 0.4},
    {"winner": 2, "loser": 1, "weight": 0.2},
]


def client_profile(modality: str = "cbt", **kwargs: Any) -> ClientProfile:
    profile = ClientProfileFactory(modality=modality, **kwargs)
    grant_all_consents(profile)
    return profile


def course_for(profile: ClientProfile) -> Course:
    course = Course.objects.filter(client=profile.user, status="active").first()
    return course or Course.objects.create(client=profile.user, modality=profile.modality)


def make_session(
    profile: ClientProfile,
    *,
    reward: float | None = 0.5,
    rating: dict[str, float] | None = None,
    skill: str | None = None,
    slot: str = SLOT,
    credit: float = 0.8,
    open_: bool = False,
    client_text: str = "I feel anxious about work",
    reply: str = "That sounds hard. <b>Tell me</b> more.",
) -> Session:
    """One session: a client turn, a counselor reply with its decision and candidate
    group, and (unless ``open_``) the session end with one Eq. 4 update of the cell."""
    course = course_for(profile)
    index = course.sessions.count()
    last = Session.objects.filter(client=profile.user).order_by("-ended_at").first()
    ended = (last.ended_at if last and last.ended_at else timezone.now()) + timedelta(minutes=1)
    skills = [s.id for s in skills_for(profile.modality)]
    skill = skill or skills[0]
    session = Session.objects.create(
        course=course,
        client=profile.user,
        index=index,
        status="open" if open_ else "ended",
        ended_at=None if open_ else ended,
        session_reward=None if open_ else reward,
        rating=rating,
        rated=rating is not None,
        outcome=None if open_ else {"turn_outcomes": [0.7], "credit": [credit]},
    )
    Turn.objects.create(
        session=session, seq=0, role="client", text=client_text, author=profile.user
    )
    turn = Turn.objects.create(
        session=session, seq=1, role="counselor", text=reply, skill=skill, state_slot=slot
    )
    q = PriorTable.load_default().for_state(profile.modality, slot)
    SkillDecision.objects.create(
        turn=turn,
        state_slot=slot,
        chosen=skill,
        records={
            s: {
                "probability": 1.0 / len(skills),
                "mean": 0.0,
                "sd": 0.5,
                "draw": 0.1,
                "shared_value": q[s],
            }
            for s in skills
        },
    )
    CandidateGroup.objects.create(
        turn=turn,
        session=session,
        client=profile.user,
        modality=profile.modality,
        group_key=uuid.uuid4().hex,
        mode="graph",
        state_slot=slot,
        skill=skill,
        prompt=[{"role": "user", "content": client_text}],
        candidates=[reply, "Rating 3 of 5. <script>alert(1)</script>", "Which option fits?"],
        judgments={},
        support={},
        edges=EDGES,
        pointwise=[4.0, 2.0, 3.0],
        depths=[2, 0, 1],
        delivered=0,
        admissible=True,
        edge_count=len(EDGES),
    )
    if not open_:
        update_cell(profile, session, turn, slot, skill, credit, q[skill])
    return session


def update_cell(
    profile: ClientProfile, session: Session, turn: Turn | None, slot: str, skill: str,
    credit: float, shared: float,
) -> PosteriorUpdate:  # fmt: skip
    cell, _ = PosteriorCell.objects.get_or_create(
        client=profile.user,
        state_slot=slot,
        skill=skill,
        defaults={"modality": profile.modality, "mean": 0.0, "precision": 4.0},
    )
    residual = credit - shared
    mean, precision = posterior_update(cell.mean, cell.precision, residual)
    update = PosteriorUpdate.objects.create(
        cell=cell,
        session=session,
        turn=turn,
        mean_before=cell.mean,
        precision_before=cell.precision,
        mean_after=mean,
        precision_after=precision,
        residual=residual,
        credit=credit,
        shared_value=shared,
    )
    cell.mean, cell.precision, cell.n = mean, precision, cell.n + 1
    cell.save()
    return update
