"""Validation reports never carry real client text to the approval page (issue 18).

The approval page is open to every clinician and admin; a held-out evidence group is
some client's real conversation. Side-by-side states come from project-written prompts,
and older reports that copied evidence are shown (and migrated) as withheld.
"""

from __future__ import annotations

import importlib
import json

import pytest
from django.apps import apps
from django.urls import reverse

from training_worker.round import run_round
from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.tests.helpers import (
    make_evidence,
    make_groups,
    make_version,
    write_adapter_files,
)

pytestmark = pytest.mark.django_db

CANARY = "CANARY-7f3a my sister's name is Ottilie and I hide it from everyone"


def canary_groups(count: int = 2) -> list:  # type: ignore[type-arg]
    """Another client's evidence, its prompt and every candidate holding the canary."""
    groups = make_groups(count, "cbt")
    for group in groups:
        group.prompt = [
            {"role": "system", "content": "You are a warm, careful counselor."},
            {"role": "user", "content": CANARY},
        ]
        group.candidates = [f"{CANARY} (reply {i})" for i in range(3)]
        group.save(update_fields=["prompt", "candidates"])
    return groups


def test_it_never_puts_another_clients_words_in_the_report_or_the_page(client, lipo_settings):  # type: ignore[no-untyped-def]
    make_evidence()
    canary_groups()  # newest: held out, and they would have been the side-by-side states
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "pending_approval"

    version = TrainingRun.objects.get(pk=run.pk).output_version
    report = version.validation_report
    assert CANARY.split()[0] not in json.dumps(report)
    heldout = next(c for c in report["checks"] if c["name"] == "heldout_preference_accuracy")
    assert heldout["groups"] >= 2  # the client's evidence still counted, as a number
    sides = report["side_by_side"]
    assert len(sides) == 2 and {s["source"] for s in sides} == {"project"}
    assert {s["modality"] for s in sides} <= {"cbt", "bt"}  # the batch's modalities first
    for viewer in (ClinicianFactory(), AdminFactory()):
        client.force_login(viewer)
        page = client.get(reverse("learning:adapter", args=[version.pk]))
        assert page.status_code == 200
        body = page.content.decode()
        assert "CANARY-7f3a" not in body and "Ottilie" not in body
        assert sides[0]["prompt"][-1]["content"] in body.replace("&#x27;", "'")


def legacy_report() -> dict:  # type: ignore[type-arg]
    return {
        "passed": True,
        "checks": [],
        "side_by_side": [
            {"group": "g-old", "modality": "cbt", "held_out": True,
             "prompt": [{"role": "user", "content": CANARY}],
             "parent": f"parent echoes {CANARY}", "candidate": f"candidate echoes {CANARY}"},
            {"id": "bt-evenings", "source": "project", "modality": "bt",
             "prompt": [{"role": "user", "content": "I lie on the sofa all evening."}],
             "parent": "Tell me more.", "candidate": "What would a small change be?"},
        ],
    }  # fmt: skip


def test_it_withholds_client_text_that_an_older_report_holds(client, tmp_path):  # type: ignore[no-untyped-def]
    files = write_adapter_files(tmp_path / "v-old")
    version = make_version("v-old", "pending_approval", files, validation_report=legacy_report())
    client.force_login(ClinicianFactory())

    body = client.get(reverse("learning:adapter", args=[version.pk])).content.decode()

    assert "CANARY-7f3a" not in body and "Ottilie" not in body
    assert "Withheld: this entry was made from a client" in body
    assert "I lie on the sofa all evening." in body  # project-written text is shown


def test_the_migration_strips_client_text_from_stored_reports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = write_adapter_files(tmp_path / "v-old")
    old = make_version("v-old", "retired", files, validation_report=legacy_report())
    kept = make_version("v-none", "failed", validation_report=None)
    odd = make_version("v-odd", "failed", validation_report={"side_by_side": ["x", 3]})
    migration = importlib.import_module(
        "webapp.learning.migrations.0009_validation_reports_drop_client_text"
    )

    migration.drop_client_text(apps, None)

    report = AdapterVersion.objects.get(pk=old.pk).validation_report
    assert "CANARY-7f3a" not in json.dumps(report)
    assert report["side_by_side"][0] == {"modality": "cbt", "withheld": True}
    assert report["side_by_side"][1] == legacy_report()["side_by_side"][1]
    assert AdapterVersion.objects.get(pk=kept.pk).validation_report is None
    assert AdapterVersion.objects.get(pk=odd.pk).validation_report["side_by_side"] == [
        {"modality": "", "withheld": True},
        {"modality": "", "withheld": True},
    ]
