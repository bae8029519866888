"""A client's own data, as one JSON document (right of access / portability).

Everything the product keeps about the client: account, profile, consent history, courses
and sessions with the full transcript, the skill decision and the candidates behind each
counselor reply, memory with its whole correction history, posterior cells with their
update history, safety flags, the clinician's controls, which of their evidence groups an
approved adapter already trained on, and who accessed their data (audit events about
them, by action and role; staff names are not exported).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from webapp.accounts.models import ClientProfile, User
from webapp.counseling.models import Session
from webapp.learning.models import CandidateGroup, PosteriorCell, PosteriorUpdate
from webapp.memory.models import MemoryItem
from webapp.oversight.data_rights.erasure import used_by_approved_adapters
from webapp.oversight.models import AuditEvent, ClientControl, SafetyFlag

FORMAT = "psyevo.client-export/1"


def _t(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def client_export(client: User) -> dict[str, Any]:
    profile = ClientProfile.objects.filter(user=client).select_related("clinician").first()
    return {
        "format": FORMAT,
        "exported_at": _t(timezone.now()),
        "account": {
            "id": client.pk,
            "username": client.username,
            "email": client.email,
            "first_name": client.first_name,
            "last_name": client.last_name,
            "date_joined": _t(client.date_joined),
            "last_login": _t(client.last_login),
        },
        "profile": _profile(profile),
        "sessions": _sessions(client),
        "memory": [
            {
                "id": m.pk,
                "kind": m.kind,
                "text": m.text,
                "origin": m.origin,
                "source_session": m.source_session_id,
                "source_turn": m.source_turn,
                "supersedes": m.supersedes_id,
                "created_at": _t(m.created_at),
                "retired_at": _t(m.retired_at),
            }
            for m in MemoryItem.objects.filter(client=client).order_by("created_at", "id")
        ],
        "posterior": _posterior(client),
        "safety_flags": [
            {
                "session": f.session_id,
                "turn": f.turn_id,
                "level": f.level,
                "categories": f.categories,
                "created_at": _t(f.created_at),
                "acknowledged_at": _t(f.acknowledged_at),
            }
            for f in SafetyFlag.objects.filter(client=client).order_by("created_at")
        ],
        "controls": _controls(client),
        # Evidence an approved adapter already trained on: withdrawing training consent
        # (or erasure) cannot take it back out of those weights, so the client is told.
        "used_by_approved_adapters": used_by_approved_adapters(client),
        "access_log": [
            {
                "action": e.action,
                "actor_role": e.actor.role if e.actor else "system",
                "target": e.target,
                "at": _t(e.created_at),
            }
            for e in AuditEvent.objects.filter(subject=client)
            .select_related("actor")
            .order_by("created_at", "id")
        ],
    }


def _profile(profile: ClientProfile | None) -> dict[str, Any] | None:
    if profile is None:
        return None
    return {
        "modality": profile.modality,
        "clinician": profile.clinician.get_full_name() or profile.clinician.username
        if profile.clinician
        else None,
        "created_at": _t(profile.created_at),
        "consents": [
            {"purpose": c.purpose, "granted": c.granted, "recorded_at": _t(c.recorded_at)}
            for c in profile.consents.order_by("recorded_at", "id")
        ],
    }


def _sessions(client: User) -> list[dict[str, Any]]:
    groups = {g.turn_id: g for g in CandidateGroup.objects.filter(client=client)}
    out = []
    for s in (
        Session.objects.filter(client=client)
        .select_related("course", "adapter_version")
        .prefetch_related("turns__decision")
        .order_by("started_at", "id")
    ):
        out.append(
            {
                "id": s.pk,
                "course": s.course_id,
                "modality": s.course.modality,
                "index": s.index,
                "status": s.status,
                "started_at": _t(s.started_at),
                "ended_at": _t(s.ended_at),
                "adapter_version": s.adapter_version.name if s.adapter_version else None,
                "rating": s.rating,
                "session_reward": s.session_reward,
                "internal_reward": s.internal_reward,
                "outcome": s.outcome,
                "turns": [
                    _turn(t, groups.get(t.pk)) for t in sorted(s.turns.all(), key=lambda t: t.seq)
                ],
            }
        )
    return out


def _turn(turn: Any, group: CandidateGroup | None) -> dict[str, Any]:
    decision = getattr(turn, "decision", None)
    return {
        "seq": turn.seq,
        "role": turn.role,
        "text": turn.text,
        "created_at": _t(turn.created_at),
        "skill": turn.skill,
        "state_slot": turn.state_slot,
        "safety_level": turn.safety_level,
        "decision": None
        if decision is None
        else {"chosen": decision.chosen, "pinned": decision.pinned, "records": decision.records},
        "candidates": None
        if group is None
        else {
            "texts": group.candidates,
            "edges": group.edges,
            "depths": group.depths,
            "delivered": group.delivered,
            "guard": group.guard,
        },
    }


def _posterior(client: User) -> list[dict[str, Any]]:
    updates: dict[int, list[dict[str, Any]]] = {}
    for u in PosteriorUpdate.objects.filter(cell__client=client).order_by("created_at", "id"):
        updates.setdefault(u.cell_id, []).append(
            {
                "session": u.session_id,
                "mean_before": u.mean_before,
                "mean_after": u.mean_after,
                "precision_after": u.precision_after,
                "credit": u.credit,
                "at": _t(u.created_at),
            }
        )
    return [
        {
            "state_slot": c.state_slot,
            "skill": c.skill,
            "mean": c.mean,
            "precision": c.precision,
            "n": c.n,
            "updates": updates.get(c.pk, []),
        }
        for c in PosteriorCell.objects.filter(client=client).order_by("state_slot", "skill")
    ]


def _controls(client: User) -> dict[str, Any] | None:
    control = ClientControl.objects.filter(client=client).first()
    if control is None:
        return None
    return {
        "ai_paused": control.ai_paused,
        "pinned_skill": control.pinned_skill,
        "excluded_skills": control.excluded_skills,
    }
