"""Memory corrections pass the instruction filter that recaps pass (issue 18, item 4):
a correction goes into every later system prompt of its client just as a recap does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from django.urls import reverse

from counselor_engine import memory as engine_memory
from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.memory import services as memory_services
from webapp.memory.models import MemoryItem
from webapp.oversight.tests.helpers import client_profile

pytestmark = pytest.mark.django_db

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "injection_cases.jsonl"


def attack_texts() -> list[str]:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    return sorted({r["text"].format(victim="alice") for r in rows})


def test_a_clinician_correction_from_the_injection_corpus_is_refused(client, caplog):  # type: ignore[no-untyped-def]
    profile = client_profile()
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Has a dog", origin="counselor"
    )
    attack = next(
        json.loads(line)["text"] for line in CORPUS.read_text().splitlines()
        if '"id": "direct-00"' in line
    ).format(victim="alice")  # fmt: skip
    client.force_login(profile.clinician)
    url = reverse("clinician_memory_correct", args=[profile.user_id, item.pk])

    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        response = client.post(url, {"text": f"Has two dogs. {attack}"}, follow=True)

    assert "reads as an instruction to the AI counselor" in response.content.decode()
    assert not MemoryItem.objects.filter(supersedes=item).exists()
    assert [i.text for i in memory_services.active_items(profile.user)] == ["Has a dog"]
    assert any("instruction-like correction" in r.getMessage() for r in caplog.records)


def test_corrections_and_recaps_share_one_filter() -> None:
    """Every corpus text: a correction is refused exactly when a recap would lose part
    of it, and nothing instruction-like is ever stored."""
    profile = client_profile()
    session = services.start_session(profile.user)
    services.append_turn(session.pk, Turn.Role.CLIENT, "hello", author=profile.user)
    refused = 0
    for text in attack_texts():
        draft = engine_memory.MemoryItem(
            id="1", kind="fact", origin="counselor", source_session=None, source_turn=None,
            created_at=engine_memory._now(), text=text,
        )  # fmt: skip
        stored = memory_services.save_recap(session, [draft])
        recap_changed = [m.text for m in stored] != [text]
        item = MemoryItem.objects.create(
            client=profile.user, kind="fact", text="Has a dog", origin="client"
        )
        try:
            memory_services.correct(item.pk, text, by=profile.clinician, client=profile.user)
            corrected = True
        except memory_services.MemoryError:
            corrected = False
        assert corrected is not recap_changed, text
        refused += not corrected
    assert refused >= 20  # the corpus's override, marker and exfiltration texts
    violations = memory_services.policy_violations(profile.user)
    assert not [v for v in violations if v[1] == "instruction-like text stored"]


def test_an_ordinary_correction_of_several_lines_is_kept() -> None:
    profile = client_profile()
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Has a dog", origin="counselor"
    )
    text = "Has two dogs.\nWalks them before work, and would like to keep doing that."

    new = memory_services.correct(item.pk, text, by=profile.user, client=profile.user)

    assert new.text == text and new.supersedes == item
