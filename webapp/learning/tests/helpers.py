"""Fixtures and builders shared by the learning and training_worker tests.

Evidence is built so that learning generalises: in every group candidate 0 is a warm,
in-corpus counselor reply and the others are off-topic, so a few LiPO steps on the tiny
model raise held-out preference accuracy deterministically.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from django.utils import timezone

from webapp.accounts.models import ClientProfile
from webapp.accounts.tests.factories import ClientProfileFactory, ClinicianFactory
from webapp.counseling.models import Course, Session, Turn
from webapp.learning.models import AdapterVersion, CandidateGroup
from webapp.learning.services import adapter_digest

WINNERS = (
    "That sounds really hard. Can you tell me more about it?",
    "It makes sense that you feel this way.",
    "I hear that you are carrying a lot right now.",
)
LOSERS = ("Rating 3 of 5. Answer B.", "Which option fits better, A or B?")
FEELINGS = ("feel anxious about work", "feel sad since the move", "feel stuck at family dinners")

SMALL_LIPO: dict[str, Any] = {
    "batch_edges": 12,  # 4 groups of 3 edges
    "min_groups": 4,
    "modalities": ["cbt", "bt"],
    "min_share": 0.25,
    "lora_rank": 4,
    "learning_rate": 5e-3,
    "steps": 2,
    "beta": 0.5,
    "max_length": 64,
    "heldout_groups": 4,
    "side_by_side": 2,
    "side_by_side_tokens": 6,
    "max_update_ratio": 0.5,
    "micro_batch_tokens": 512,
    "arena_clients": 0,  # the arena check is off by default; tests that want it set 1
    "arena_sessions": 1,
    "arena_turns": 2,
    "arena_candidates": 2,
}


@pytest.fixture
def lipo_settings(settings: Any, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """Small rounds on the tiny model, adapters in a temporary folder."""
    settings.PSYEVO_MODEL_PATH = str(tiny_model_dir)
    settings.ADAPTER_DIR = tmp_path / "adapters"
    settings.LIPO = replace(settings.LIPO, **SMALL_LIPO, queue=f"training-test-{uuid.uuid4().hex}")
    yield settings


def make_groups(count: int, modality: str = "cbt", **fields: Any) -> list[CandidateGroup]:
    """``count`` admissible groups of one new client: 3 candidates, 3 edges each."""
    profile = cast(ClientProfile, ClientProfileFactory(modality=modality))
    course = Course.objects.create(client=profile.user, modality=modality)
    session = Session.objects.create(
        course=course, client=profile.user, index=0, status="ended", ended_at=timezone.now()
    )
    groups = []
    for i in range(count):
        turn = Turn.objects.create(session=session, seq=i, role="counselor", text=WINNERS[0])
        values: dict[str, Any] = {
            "turn": turn,
            "session": session,
            "client": profile.user,
            "modality": modality,
            "group_key": uuid.uuid4().hex,
            "mode": "graph",
            "state_slot": "formulation:early:anxiety",
            "skill": "RF",
            "prompt": [
                {"role": "system", "content": "You are a warm, careful counselor."},
                {"role": "user", "content": f"I {FEELINGS[i % len(FEELINGS)]} ({i})."},
            ],
            "candidates": [WINNERS[i % len(WINNERS)], LOSERS[0], LOSERS[1]],
            "judgments": {},
            "support": {},
            "edges": [
                {"winner": 0, "loser": 1, "weight": 0.6},
                {"winner": 0, "loser": 2, "weight": 0.5},
                {"winner": 2, "loser": 1, "weight": 0.2},
            ],
            "pointwise": [4, 2, 2],
            "depths": [2, 0, 1],
            "delivered": 0,
            "admissible": True,
            "edge_count": 3,
        }
        values.update(fields)
        groups.append(CandidateGroup.objects.create(**values))
    return groups


def make_evidence(per_modality: int = 3) -> list[CandidateGroup]:
    return make_groups(per_modality, "cbt") + make_groups(per_modality, "bt")


def write_adapter_files(directory: Path, payload: bytes = b"weights") -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text('{"r": 4}')
    (directory / "adapter_model.safetensors").write_bytes(payload)
    return directory


def make_version(
    name: str,
    status: str,
    directory: Path | None = None,
    *,
    approver: Any = None,
    **fields: Any,
) -> AdapterVersion:
    """A version row (with files, when ``directory`` is given) in any status; servable
    statuses get an approval by a clinician."""
    values: dict[str, Any] = {"name": name, "status": status}
    if directory is not None:
        sha = adapter_digest(directory)
        values.update(path=str(directory), sha256=sha)
        if status in ("approved", "active", "retired"):
            values.update(
                approved_by=approver or ClinicianFactory(),
                approved_at=timezone.now(),
                approved_sha256=sha,
            )
    values.update(fields)
    return AdapterVersion.objects.create(**values)
