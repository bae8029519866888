"""A round in process on the tiny model: phases, hand-off, failure paths, attempts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training_worker.round import run_round
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.services import adapter_digest
from webapp.learning.tests.helpers import make_evidence, make_groups, make_version

pytestmark = pytest.mark.django_db

Buffer = CandidateGroup.Buffer


def statuses(groups: list[CandidateGroup]) -> list[str]:
    return [CandidateGroup.objects.get(pk=g.pk).buffer_status for g in groups]


def test_it_produces_a_pending_version_with_a_report(lipo_settings):  # type: ignore[no-untyped-def]
    # The arena on one simulated client; a tolerance of the whole 0-10 scale, since a
    # random tiny model's scores say nothing (the rule is tested in test_ablation_and_arena).
    lipo_settings.LIPO = replace(lipo_settings.LIPO, arena_clients=1, arena_tolerance=10.0)
    groups = make_evidence()
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "pending_approval"

    run.refresh_from_db()
    version = run.output_version
    assert run.status == "succeeded" and run.attempts == 1 and run.phase == "done"
    assert version is not None and version.status == "pending_approval"
    assert version.name == f"v{version.pk}" and version.parent is None
    assert run.group_count == 4 and run.edge_count == 12
    assert set(run.modality_shares) == {"cbt", "bt"}
    assert [
        p
        for p in ("claim", "load", "reference", "optimise", "save", "validate")
        if p in run.timings
    ]
    assert len(run.loss_curve) == 2 and all(step["loss"] is not None for step in run.loss_curve)
    # The files: peft's two, read-only, digest recorded.
    path = Path(version.path)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in path.iterdir()}
    assert version.sha256 == adapter_digest(path)
    # The report: every check, and replies of both versions to held-out states.
    report = version.validation_report
    assert report["passed"] is True
    names = {c["name"] for c in report["checks"]}
    assert names >= {"finite_loss_and_gradients", "update_norm", "heldout_preference_accuracy",
                     "crisis_safety_path", "arena", "output_guard"}  # fmt: skip
    guard = next(c for c in report["checks"] if c["name"] == "output_guard")
    assert guard["replies"] == 7  # every project-written state, both versions
    arena = next(c for c in report["checks"] if c["name"] == "arena")
    assert not arena.get("skipped") and arena["candidate_version"] == version.name
    assert set(arena["guard"]) == {"active", "candidate"}
    # Every arena candidate is checked (the tiny model's token soup may make every turn a
    # crisis turn, which has no candidates, so the count itself may be 0).
    n = lipo_settings.LIPO.arena_candidates  # the counselor's N in the arena
    for side in ("active", "candidate"):
        counts = arena["guard"][side]
        assert counts["candidates"] == n * counts["turns"]
    assert arena["active_version"] == "base model" and arena["active"]["overall"] is not None
    assert set(arena["candidate"]) == set(arena["active"]) >= {"overall", "c_shared"}
    heldout = next(c for c in report["checks"] if c["name"] == "heldout_preference_accuracy")
    assert heldout["groups"] == 2 and heldout["candidate"] >= heldout["parent"]
    assert len(report["side_by_side"]) == 2  # project-written states (test_report_privacy)
    assert {s["source"] for s in report["side_by_side"]} == {"project"}
    # Evidence: the batch is held for the decision (no expiry); the rest stays available.
    held = CandidateGroup.objects.filter(lease_run=run)
    assert held.count() == 4 and set(run.batch) == set(held.values_list("pk", flat=True))
    assert all(g.buffer_status == Buffer.RESERVED and g.lease_expires_at is None for g in held)
    assert statuses(groups).count(Buffer.AVAILABLE) == 2


def test_it_changes_lora_weights_and_never_the_base(lipo_settings, tmp_path):  # type: ignore[no-untyped-def]
    from counselor_engine.backends.tiny import build_tiny_adapter

    parent_dir = build_tiny_adapter(Path(lipo_settings.PSYEVO_MODEL_PATH), tmp_path / "p", seed=3)
    parent = make_version("v-parent", "active", parent_dir)
    make_evidence()
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "pending_approval"

    run.refresh_from_db()
    assert run.parent_version == parent and run.output_version.parent == parent
    before = load_file(str(parent_dir / "adapter_model.safetensors"))
    after = load_file(str(Path(run.output_version.path) / "adapter_model.safetensors"))
    assert before.keys() == after.keys()  # continued from the parent: same adapter shape
    assert all("lora_" in key for key in after)  # only adapter weights are saved
    assert any(not torch.equal(before[k], after[k]) for k in before)
    parent.refresh_from_db()
    assert parent.status == "active"  # training never touches the active version


def test_it_fails_validation_and_returns_the_evidence(lipo_settings):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, max_update_ratio=1e-12)
    groups = make_evidence()
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "failed"

    run.refresh_from_db()
    assert run.status == "failed" and "update_norm" in run.error
    assert run.output_version.status == "failed"
    failed = [c for c in run.output_version.validation_report["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["update_norm"]
    assert statuses(groups) == [Buffer.AVAILABLE] * 6
    assert not AdapterVersion.objects.filter(status="active").exists()


def test_it_skips_when_no_admissible_batch_exists(lipo_settings):  # type: ignore[no-untyped-def]
    groups = make_groups(3, "cbt")  # no bt evidence: the modality quota cannot be met
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "skipped"

    run.refresh_from_db()
    assert run.status == "skipped" and run.output_version is None
    assert statuses(groups) == [Buffer.AVAILABLE] * 3


def test_it_excludes_malformed_evidence_and_trains_on_the_rest(lipo_settings):  # type: ignore[no-untyped-def]
    bad = make_groups(1, "cbt", edges=[{"winner": 0, "loser": 7, "weight": 0.5}] * 3)
    make_evidence()
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "pending_approval"

    bad[0].refresh_from_db()
    assert bad[0].buffer_status == Buffer.EXCLUDED and "malformed" in bad[0].problem


def test_a_redelivered_task_for_a_finished_run_does_nothing(lipo_settings):  # type: ignore[no-untyped-def]
    make_evidence()
    run = TrainingRun.objects.create()
    assert run_round(run.pk) == "pending_approval"

    assert run_round(run.pk) == "noop"

    run.refresh_from_db()
    assert run.attempts == 1 and AdapterVersion.objects.count() == 1


def test_a_poison_run_stops_after_its_attempts(lipo_settings):  # type: ignore[no-untyped-def]
    groups = make_evidence()
    run = TrainingRun.objects.create(status="running", attempts=3, phase="optimise")
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups[:4]]).update(
        buffer_status=Buffer.RESERVED, lease_run=run
    )

    assert run_round(run.pk) == "noop"

    run.refresh_from_db()
    assert run.status == "failed" and "gave up after 3 attempts" in run.error
    assert statuses(groups) == [Buffer.AVAILABLE] * 6


def test_a_new_attempt_takes_over_from_a_dead_one(lipo_settings):  # type: ignore[no-untyped-def]
    groups = make_evidence()
    dead = AdapterVersion.objects.create(name="v-dead", status="training")
    run = TrainingRun.objects.create(
        status="running", attempts=1, phase="optimise", output_version=dead
    )
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups[:4]]).update(
        buffer_status=Buffer.RESERVED, lease_run=run
    )

    assert run_round(run.pk) == "pending_approval"

    run.refresh_from_db()
    dead.refresh_from_db()
    assert run.attempts == 2 and run.output_version != dead
    assert dead.status == "failed"


def test_a_tampered_parent_fails_the_round(lipo_settings, tmp_path):  # type: ignore[no-untyped-def]
    from counselor_engine.backends.tiny import build_tiny_adapter

    parent_dir = build_tiny_adapter(Path(lipo_settings.PSYEVO_MODEL_PATH), tmp_path / "p", seed=3)
    make_version("v-parent", "active", parent_dir)
    (parent_dir / "adapter_model.safetensors").write_bytes(b"evil")
    groups = make_evidence()
    run = TrainingRun.objects.create()

    assert run_round(run.pk) == "failed"

    run.refresh_from_db()
    assert "TamperedAdapter" in run.error
    assert statuses(groups) == [Buffer.AVAILABLE] * 6
