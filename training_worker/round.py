"""One LiPO round around the database: claim, reference pass, optimise, save, validate,
hand off to the approval gate (paper App. C, "Session boundaries and failed updates").

The ``TrainingRun`` row is the source of truth. Crash safety:

- Each delivery of the task is one *attempt*. It starts by incrementing
  ``TrainingRun.attempts`` under a row lock, and every later write is a conditional
  UPDATE on ``attempts = <mine>``: if another delivery took over, the old attempt's
  writes match nothing and it stops (a fencing token).
- A run in a terminal status makes the task a no-op (a redelivered message for a
  finished run). A run that already used ``LIPO.max_attempts`` attempts is failed
  instead of started again (a poison run that kills its worker stops after 3).
- Evidence is claimed ``FOR UPDATE SKIP LOCKED`` and leased (available -> reserved, the
  run, an expiry). The live attempt renews the lease at every phase and step; if the
  worker dies, ``release_expired_leases`` returns the evidence once the lease expires.
- The candidate is written into a new folder (never over an existing one) and only a
  clinician's approval activates it, so no crash can change the active version.
  Evidence becomes ``consumed`` only when the version is activated; until a decision it
  stays reserved with no expiry.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from counselor_engine.backends.adapter_files import verify_adapter
from counselor_engine.lipo.config import LipoConfig
from training_worker.arena import ArenaSpec
from training_worker.trainer import LipoTrainer, StepStats, TrainGroup, to_edges
from training_worker.validation import validate
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.schedule import available_graphs, pick_batch, trainable_clients
from webapp.learning.services import (
    active_version,
    adapter_digest,
    fail_unfinished_version,
    lease_deadline,
    release_expired_leases,
    return_evidence,
    servable_path,
    supersede_if_stale,
)

log = logging.getLogger(__name__)

Run = TrainingRun.Status
Version = AdapterVersion.Status
Buffer = CandidateGroup.Buffer
TERMINAL = (Run.SUCCEEDED, Run.FAILED, Run.SKIPPED)
Progress = Callable[[str, int, int], None]
HANG_ENV = "PSYEVO_TEST_HANG_PHASE"


class Superseded(Exception):
    """Another attempt owns this run now, or our evidence lease was lost: stop quietly."""


def lipo() -> LipoConfig:
    """``settings.LIPO``: built and validated once at startup (webapp/settings.py)."""
    config: LipoConfig = settings.LIPO
    return config


def round_config(loss: str | None = None) -> LipoConfig:
    """The round's settings; ``loss`` comes from the run's config (``pairwise_dpo`` when
    a simulation run with that ablation queued it), else ``LIPO.loss``."""
    config = lipo()
    return replace(config, loss=loss) if loss else config


def model_path() -> Path:
    if settings.PSYEVO_MODEL_PATH:
        return Path(settings.PSYEVO_MODEL_PATH)
    from counselor_engine.models import resolve_model_path

    return resolve_model_path(progress=log.info)


# -- fencing ----------------------------------------------------------------------------


@dataclass
class Fence:
    """This attempt's right to write the run: every write is conditional on it."""

    run_id: int
    attempt: int
    batch: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def _mine(self) -> Any:
        return TrainingRun.objects.filter(pk=self.run_id, attempts=self.attempt, status=Run.RUNNING)

    def advance(self, phase: str | None = None, **fields: Any) -> None:
        """Record progress and renew the leases (run and evidence) - the heartbeat."""
        lease = lease_deadline()
        if phase is not None:
            fields["phase"] = phase
        if self._mine().update(lease_expires_at=lease, timings=self.timings, **fields) != 1:
            raise Superseded(f"run {self.run_id}: attempt {self.attempt} was superseded")
        if self.batch:
            held = CandidateGroup.objects.filter(
                lease_run_id=self.run_id, buffer_status=Buffer.RESERVED
            ).update(lease_expires_at=lease)
            if held != len(self.batch):
                raise Superseded(
                    f"run {self.run_id}: evidence lease lost ({held}/{len(self.batch)})"
                )
        if phase is not None:
            _test_hang(phase)

    def lock(self) -> TrainingRun:
        """Inside a transaction: lock the run row, or raise if it is no longer ours."""
        run = self._mine().select_for_update().first()
        if run is None:
            raise Superseded(f"run {self.run_id}: attempt {self.attempt} was superseded")
        return run


def _test_hang(phase: str) -> None:
    """Test hook: with ``PSYEVO_TEST_HANG_PHASE=<phase>`` in a test environment
    (``settings.TESTING``), the worker stops here forever, so a test can SIGKILL it
    mid-phase. Inert in production (TESTING is false)."""
    if settings.TESTING and os.environ.get(HANG_ENV) == phase:
        log.warning("test hook: hanging in phase %s", phase)
        while True:
            time.sleep(0.2)


# -- attempts ---------------------------------------------------------------------------


def begin_attempt(run_id: int) -> int | None:
    """Start (or take over) the run; None when there is nothing to do.

    1. Lock the run row. Missing or terminal: nothing to do (a redelivered message).
    2. Out of attempts: fail it, return its evidence (a poison run stops here).
    3. Otherwise a previous attempt, if any, is dead or will be fenced off: return the
       evidence it held, fail the version it was writing, and start attempt n+1.
    """
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            log.warning("lipo_round: run %s does not exist", run_id)
            return None
        if run.status in TERMINAL:
            log.info("lipo_round: run %s is already %s; nothing to do", run_id, run.status)
            return None
        limit = lipo().max_attempts
        if run.attempts >= limit:
            _fail_locked(
                run, f"gave up after {run.attempts} attempts (last phase {run.phase or '?'})"
            )
            return None
        return_evidence(run)
        if run.output_version is not None:
            fail_unfinished_version(run, "superseded by a new attempt")
            # A save the dead attempt never finished (its finished folders are kept).
            staging = Path(settings.ADAPTER_DIR) / f".{run.output_version.name}.partial"
            shutil.rmtree(staging, ignore_errors=True)
        run.attempts += 1
        run.status, run.phase, run.error = Run.RUNNING, "claim", ""
        run.started_at = run.started_at or timezone.now()
        run.lease_expires_at = lease_deadline()
        run.output_version = None
        run.save(update_fields=[
            "attempts", "status", "phase", "error", "started_at", "lease_expires_at",
            "output_version",
        ])  # fmt: skip
        return run.attempts


def _fail_locked(run: TrainingRun, error: str) -> None:
    fail_unfinished_version(run, error)
    return_evidence(run)
    TrainingRun.objects.filter(pk=run.pk).update(
        status=Run.FAILED, error=error[:4000], finished_at=timezone.now(), lease_expires_at=None
    )


# -- the round --------------------------------------------------------------------------


def run_round(run_id: int, *, progress: Progress | None = None) -> str:
    """Run one attempt of round ``run_id``. Returns the outcome: ``pending_approval``,
    ``stale_parent`` (its output was superseded at once: the active version changed while
    it trained), ``failed``, ``skipped``, ``noop`` or ``superseded`` (another attempt owns
    the run). Never raises for a failed round:
    the run row records the error and the evidence goes back to the buffer."""
    release_expired_leases()
    attempt = begin_attempt(run_id)
    if attempt is None:
        return "noop"
    fence = Fence(run_id, attempt)
    try:
        return _execute(fence, progress or (lambda *_: None))
    except Superseded as exc:
        log.warning("%s", exc)
        return "superseded"
    except Exception as exc:
        log.exception("LiPO round %s failed", run_id)
        with transaction.atomic():
            try:
                run = fence.lock()
            except Superseded:
                return "superseded"
            _fail_locked(run, f"{type(exc).__name__}: {exc}")
        return "failed"


class _Clock:
    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self.phase = ""
        self.started = time.monotonic()

    def enter(self, phase: str) -> None:
        self.stop()
        self.phase = phase
        self.started = time.monotonic()
        self.fence.advance(phase)

    def stop(self) -> None:
        if self.phase:
            elapsed = time.monotonic() - self.started
            self.fence.timings[self.phase] = round(
                self.fence.timings.get(self.phase, 0.0) + elapsed, 3
            )
            self.phase = ""


def _execute(fence: Fence, progress: Progress) -> str:
    """The phases: claim -> load -> reference -> optimise -> save -> validate -> hand-off."""
    clock = _Clock(fence)
    clock.enter("claim")
    groups = claim(fence)
    if groups is None:
        clock.stop()
        with transaction.atomic():
            fence.lock()
            fence._mine().update(
                status=Run.SKIPPED, phase="done", finished_at=timezone.now(),
                lease_expires_at=None, timings=fence.timings,
                error="no admissible batch in the buffer yet",
            )  # fmt: skip
        return "skipped"
    progress("claim", 1, 1)
    run = TrainingRun.objects.get(pk=fence.run_id)
    parent = run.parent_version
    version = _new_version(fence, parent)

    clock.enter("load")
    parent_path = servable_path(parent) if parent is not None else None
    if parent is not None and parent_path is not None:
        # The trainer reads the snapshot again: hash it right before (issue 18).
        verify_adapter(parent.name, parent_path, parent.approved_sha256)
    config = round_config(run.config.get("loss"))
    trainer = LipoTrainer(model_path(), parent=parent_path, config=config)
    prepared = trainer.prepare(groups)

    clock.enter("reference")
    reference = trainer.reference(prepared)  # once per round (Eq. 5 denominator)
    progress("reference", 1, 1)

    clock.enter("optimise")
    steps: list[StepStats] = []
    curve: list[dict[str, float | None]] = []
    for index in range(config.steps):
        stats = trainer.step(prepared, reference)
        steps.append(stats)
        curve.append(
            {"step": index + 1, "loss": _num(stats.loss), "grad_norm": _num(stats.grad_norm)}
        )
        fence.advance(loss_curve=curve)
        progress("optimise", index + 1, config.steps)
        if not stats.finite:
            break

    clock.enter("save")
    path = trainer.save(Path(settings.ADAPTER_DIR) / version.name)
    sha = adapter_digest(path)
    if (
        AdapterVersion.objects.filter(pk=version.pk, status=Version.TRAINING).update(
            status=Version.VALIDATING, path=str(path), sha256=sha
        )
        != 1
    ):
        raise Superseded(f"{version.name} is no longer training")
    progress("save", 1, 1)

    clock.enter("validate")
    report = validate(
        trainer,
        steps=steps,
        heldout=heldout_groups(fence.batch),
        modalities=sorted({g.modality for g in groups}),
        config=config,
        arena=arena_spec(version, path),
    )
    report.update(run=fence.run_id, attempt=fence.attempt, parent=parent.name if parent else None)
    progress("validate", 1, 1)
    clock.stop()
    outcome = _hand_off(fence, version, report)
    if outcome == "pending_approval" and supersede_if_stale(version):
        # The active version changed while we trained (issue 19): the output can never be
        # approved; its evidence is back in the buffer and a round from the active
        # version may have been queued. (Not "superseded": that outcome means another
        # attempt owns this run.)
        return "stale_parent"
    return outcome


def arena_spec(candidate: AdapterVersion, path: Path) -> ArenaSpec:
    """The arena compares the candidate with the version active NOW (what clients
    would otherwise keep getting), whose files are re-checked before loading."""
    active = active_version()
    return ArenaSpec(
        model_path=model_path(),
        active_path=servable_path(active) if active is not None else None,
        active_name=active.name if active is not None else None,
        candidate_path=path,
        candidate_name=candidate.name,
        active_sha256=active.approved_sha256 if active is not None else "",
    )


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _new_version(fence: Fence, parent: AdapterVersion | None) -> AdapterVersion:
    """The candidate's row, named ``v<id>`` (its folder has the same name)."""
    with transaction.atomic():
        fence.lock()
        version = AdapterVersion.objects.create(name=f"tmp-{uuid.uuid4().hex[:16]}", parent=parent)
        try:
            with transaction.atomic():
                AdapterVersion.objects.filter(pk=version.pk).update(name=f"v{version.pk}")
            version.name = f"v{version.pk}"
        except IntegrityError:  # a hand-made version already took that name
            version.name = f"v{version.pk}-run{fence.run_id}"
            AdapterVersion.objects.filter(pk=version.pk).update(name=version.name)
        fence._mine().update(output_version=version)
    return version


def _hand_off(fence: Fence, version: AdapterVersion, report: dict[str, Any]) -> str:
    """Passed: pending approval, evidence held (no expiry) for the clinician's decision.
    Failed: version failed, evidence back to the buffer, the active version untouched."""
    with transaction.atomic():
        run = fence.lock()
        now = timezone.now()
        if report["passed"]:
            if (
                AdapterVersion.objects.filter(pk=version.pk, status=Version.VALIDATING).update(
                    status=Version.PENDING_APPROVAL, validation_report=report
                )
                != 1
            ):  # failed meanwhile (an erasure stops the round and its version together)
                raise Superseded(f"{version.name} is no longer validating")
            CandidateGroup.objects.filter(lease_run=run, buffer_status=Buffer.RESERVED).update(
                lease_expires_at=None
            )
            fence._mine().update(
                status=Run.SUCCEEDED, phase="done", finished_at=now,
                lease_expires_at=None, timings=fence.timings,
            )  # fmt: skip
            outcome = "pending_approval"
        else:
            failed = [c["name"] for c in report["checks"] if not c["passed"]]
            AdapterVersion.objects.filter(pk=version.pk, status=Version.VALIDATING).update(
                status=Version.FAILED, validation_report=report,
                decision_note=f"validation failed: {', '.join(failed)}",
            )  # fmt: skip
            return_evidence(run)
            fence._mine().update(
                status=Run.FAILED, phase="done", finished_at=now, lease_expires_at=None,
                timings=fence.timings, error=f"validation failed: {', '.join(failed)}",
            )  # fmt: skip
            outcome = "failed"
    log.info("LiPO round %s: %s -> %s", fence.run_id, version.name, outcome)
    return outcome


# -- evidence ---------------------------------------------------------------------------


def claim(fence: Fence) -> list[TrainGroup] | None:
    """Reserve an admissible batch for this run, or None when there is none.

    1. Lock the available admissible groups ``FOR UPDATE SKIP LOCKED`` (a concurrent
       round skips what we hold rather than waiting on it).
    2. ``sample_batch`` picks whole graphs (App. C: 320 edges, >= 32 groups, >= 20% per
       modality, by default); none admissible: touch nothing.
    3. A chosen group whose stored evidence does not parse is marked ``excluded`` (with
       the problem) and the batch is picked again, so one bad row cannot block rounds.
    4. Mark the batch reserved with this run and a lease, record it on the run together
       with the parent (the version active now).
    """
    with transaction.atomic():
        run = fence.lock()
        graphs = available_graphs(lock=True)
        while True:
            chosen = pick_batch(graphs)
            if chosen is None:
                return None
            rows = {g.pk: g for g in CandidateGroup.objects.filter(pk__in=[c.pk for c in chosen])}
            groups, bad = [], set()
            for ref in chosen:
                try:
                    groups.append(to_train_group(rows[ref.pk]))
                except (KeyError, TypeError, ValueError) as exc:
                    bad.add(ref.pk)
                    CandidateGroup.objects.filter(pk=ref.pk).update(
                        buffer_status=Buffer.EXCLUDED, problem=f"malformed evidence: {exc}"[:200]
                    )
            if not bad:
                break
            graphs = [g for g in graphs if g.pk not in bad]
        ids = [c.pk for c in chosen]
        lease = lease_deadline()
        CandidateGroup.objects.filter(pk__in=ids, buffer_status=Buffer.AVAILABLE).update(
            buffer_status=Buffer.RESERVED, lease_run=run, lease_expires_at=lease
        )
        shares: dict[str, float] = {}
        for group in groups:
            shares[group.modality] = shares.get(group.modality, 0) + len(group.edges)
        edges = sum(shares.values())
        parent = active_version()
        fence._mine().update(
            batch=ids, edge_count=edges, group_count=len(groups), parent_version=parent,
            modality_shares={m: round(n / edges, 4) for m, n in sorted(shares.items())},
            config={**run.config, "lipo": lipo().to_dict()},
        )  # fmt: skip
        fence.batch = ids
    return groups


def to_train_group(row: CandidateGroup) -> TrainGroup:
    candidates = [str(c) for c in row.candidates]
    prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in row.prompt]
    if not prompt or len(candidates) < 2:
        raise ValueError("needs a prompt and at least two candidates")
    return TrainGroup(
        key=row.group_key,
        modality=row.modality,
        prompt=prompt,
        candidates=candidates,
        edges=to_edges(row.edges, len(candidates)),
    )


def heldout_groups(batch: list[int]) -> list[TrainGroup]:
    """Newest admissible groups outside the batch (available or consumed), capped."""
    config = lipo()
    cap = config.heldout_groups
    rows = (
        CandidateGroup.objects.filter(
            trainable_clients(),
            admissible=True,
            buffer_status__in=[Buffer.AVAILABLE, Buffer.CONSUMED],
            modality__in=config.modalities,
        )
        .exclude(pk__in=batch)
        .order_by("-created_at", "-pk")[: cap * 2]
    )
    out: list[TrainGroup] = []
    for row in rows:
        try:
            out.append(to_train_group(row))
        except (KeyError, TypeError, ValueError):
            continue  # held-out reading never changes the buffer
        if len(out) == cap:
            break
    return out
