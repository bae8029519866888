"""The learning loop end to end on the default model (issue 20, item 5).

    .venv/bin/python -m bench.bench_loop [--clients 2] [--turns 3] [--keep-db]

One driver, :func:`run_loop`, shared with the slow test
(``webapp/learning/tests/test_loop_smollm2.py``); it orchestrates nothing of its own,
it calls the product's pieces in the order a deployment meets them:

1. ``simulate``: ``simlab.plan`` + ``simlab.run_lab`` (what ``manage.py simulate
   --allow-training`` runs): simulated clients talk to SmolLM2 through the turn API,
   N candidates per turn judged by the internal evaluator (``PSYEVO_JUDGE_EVALUATOR``
   "auto", contrastive for SmolLM2), graphs and groups stored as evidence.
2. ``batch``: ``schedule.pick_batch(available_graphs())``, the rule a round claims by.
3. ``round``: a ``TrainingRun`` started by an operator and ``training_worker.round.
   run_round`` (what ``manage.py lipo_round --now`` and the Celery task call): claim,
   reference, LiPO steps, save, validation, hand-off to the approval gate.
4. ``approve``: ``learning.services.approve`` by a clinician who did not start it.
5. ``serve``: a new simulated session (``simlab`` with the active version, as a real
   session pins it) whose stored groups name the version that generated them.

Batch and validation settings are scaled down (App. C's batch is 320 edges from >= 32
groups; a few short sessions on two cores give tens of edges); the training settings
are the product's. The bench runs on a throwaway PostgreSQL database
(``test_<db>_loopbench``) and writes edges per judged turn and every stage's wall time to
bench/RESULTS.md, section "learning loop (<model>)".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402  (after the path fix above)

# Scaled-down batch and validation (the test names its own copy of these). The training
# itself (rank, rate, beta, steps) keeps the product's settings.
LOOP_LIPO: dict[str, Any] = {
    "batch_edges": 6,
    "min_groups": 2,
    "modalities": ["cbt", "bt", "het", "pdt", "pmt"],
    "min_share": 0.0,
    # Never queue a round from the schedule during the run: the driver starts it itself.
    "sessions_per_round": 1000,
    "max_length": 384,
    # Off at this scale: held-out groups would be 0-4 groups of the same few sessions,
    # and against a base parent (h = 0, every pair a tie at 0.5) a LiPO step of any sign
    # moves the figure by chance. The check has its own tests (training_worker/tests).
    "heldout_groups": 0,
    "side_by_side": 1,
    "side_by_side_tokens": 24,
    # Off: the arena plays simulated sessions of its own, minutes more on this CPU
    # (training_worker/tests/test_arena.py covers it).
    "arena_clients": 0,
}


@dataclass(frozen=True)
class LoopPlan:
    clients: int = 2
    sessions: int = 1
    max_turns: int = 3
    candidates: int = 3  # PSYEVO_CANDIDATES (5 in production)
    max_new_tokens: int = 40  # PSYEVO_MAX_NEW_TOKENS per counselor candidate
    serve_turns: int = 2  # exchanges in the session served by the new version
    seed: int = 0
    lipo: Mapping[str, Any] = field(default_factory=lambda: dict(LOOP_LIPO))


@dataclass
class LoopResult:
    stages: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    round_phases: dict[str, float] = field(default_factory=dict)  # TrainingRun.timings
    turns: int = 0  # counselor turns of the simulation
    crisis_turns: int = 0  # of which the safe reply (no candidates, nothing judged)
    judged_turns: int = 0  # groups with pairwise judgments (loop health's definition)
    pairs: int = 0
    consistent_pairs: int = 0
    edges: int = 0
    admissible_groups: int = 0
    batch_groups: int = 0
    batch_edges: int = 0
    outcome: str = ""  # run_round's outcome
    error: str = ""
    version: str | None = None
    version_status: str = ""
    checks: dict[str, str] = field(default_factory=dict)  # name -> pass | FAIL | skipped
    served_sessions: list[str | None] = field(default_factory=list)  # pinned version names
    served_groups: list[str | None] = field(default_factory=list)  # generating versions

    @property
    def edges_per_judged_turn(self) -> float:
        return self.edges / self.judged_turns if self.judged_turns else 0.0


Say = Callable[[str], None]


def loop_settings(plan: LoopPlan, workdir: Path) -> dict[str, Any]:
    """The settings the run overrides: the default model in process, short replies,
    adapters and reports in ``workdir``, LIPO scaled down."""
    from django.conf import settings

    from counselor_engine.models import ensure_default_model

    return {
        "PSYEVO_BACKEND": "transformers",
        "PSYEVO_MODEL_PATH": str(ensure_default_model()),
        "PSYEVO_MODEL_PROCESS": False,
        "PSYEVO_MODE": "graph",
        "PSYEVO_CANDIDATES": plan.candidates,
        "PSYEVO_MAX_NEW_TOKENS": plan.max_new_tokens,
        "ADAPTER_DIR": workdir / "adapters",
        "SIMULATION_REPORT_DIR": workdir / "reports",
        "LIPO": replace(
            settings.LIPO, **{**plan.lipo, "queue": f"training-loop-{uuid.uuid4().hex}"}
        ),
    }


def run_loop(plan: LoopPlan, workdir: Path, *, say: Say = print) -> LoopResult:
    """Steps 1-5 of the module docstring; stops early (result says where) when a stage
    has nothing to hand on."""
    from django.test import override_settings

    from webapp.counseling import runtime

    with override_settings(**loop_settings(plan, workdir)):
        runtime.reset_backend()
        try:
            return _run(plan, say)
        finally:
            runtime.reset_backend()


def _run(plan: LoopPlan, say: Say) -> LoopResult:
    from django.contrib.auth.hashers import make_password

    from training_worker.round import run_round
    from webapp.accounts.models import Role, User
    from webapp.counseling.models import Session, Turn
    from webapp.learning import health, services, simlab
    from webapp.learning.models import CandidateGroup, TrainingRun
    from webapp.learning.schedule import available_graphs, pick_batch

    result = LoopResult()
    tag = uuid.uuid4().hex[:8]
    operator, clinician = (
        User.objects.create(username=f"loop-{role}-{tag}", role=role, password=make_password(None))
        for role in (Role.ADMIN, Role.CLINICIAN)
    )

    def stage(name: str, started: float) -> None:
        result.stages[name] = round(time.perf_counter() - started, 1)
        say(f"{name}: {result.stages[name]:.0f} s")

    # 1. Simulated sessions on the default model, their evidence admitted for training.
    started = time.perf_counter()
    lab = simlab.plan(
        clients=plan.clients, sessions=plan.sessions, strategy="sample", adapter=None,
        max_turns=plan.max_turns, seed=plan.seed, allow_training=True,
    )  # fmt: skip
    sim = simlab.run_lab(lab)
    stage("simulate", started)
    replies = Turn.objects.filter(session__client__simulation__run=sim, role=Turn.Role.COUNSELOR)
    result.turns = replies.count()
    result.crisis_turns = replies.filter(safety_level="crisis").count()
    groups = CandidateGroup.objects.filter(session__client__simulation__run=sim)
    for support, edges, admissible in groups.values_list("support", "edge_count", "admissible"):
        if not support:
            continue
        pairs, consistent = health.pair_counts(support)
        result.judged_turns += 1
        result.pairs += pairs
        result.consistent_pairs += consistent
        result.edges += edges
        result.admissible_groups += admissible
    say(
        f"{result.turns} turns ({result.crisis_turns} crisis), {result.judged_turns} judged, "
        f"{result.edges} edges, {result.admissible_groups} admissible groups"
    )

    # 2. The batch a round would claim.
    started = time.perf_counter()
    batch = pick_batch(available_graphs())
    stage("batch", started)
    if batch is None:
        result.outcome = "no admissible batch"
        return result
    result.batch_groups = len(batch)
    result.batch_edges = sum(len(g.edges) for g in batch)

    # 3. A LiPO round, as ``lipo_round --now`` runs it (the Celery task calls the same).
    started = time.perf_counter()
    run = TrainingRun.objects.create(trigger="operator", started_by=operator)
    result.outcome = run_round(run.pk, progress=lambda phase, done, of: None)
    stage("round", started)
    run.refresh_from_db()
    result.round_phases = dict(run.timings)
    result.error = run.error
    version = run.output_version
    if version is None:
        return result
    result.version = version.name
    result.checks = {
        c["name"]: "skipped" if c.get("skipped") else "pass" if c["passed"] else "FAIL"
        for c in (version.validation_report or {}).get("checks", [])
    }
    if result.outcome != "pending_approval":
        result.version_status = version.status
        return result

    # 4. A clinician's approval makes it the active version.
    started = time.perf_counter()
    version = services.approve(version, clinician, note="loop bench")
    stage("approve", started)
    result.version_status = version.status

    # 5. A new session pins the active version and is served by it.
    started = time.perf_counter()
    again = simlab.plan(
        clients=1, sessions=1, strategy="sample", adapter=None,
        max_turns=plan.serve_turns, seed=plan.seed + 1, allow_training=False,
    )  # fmt: skip
    served = simlab.run_lab(again)
    stage("serve", started)
    sessions = Session.objects.filter(client__simulation__run=served).select_related(
        "adapter_version"
    )
    result.served_sessions = [
        s.adapter_version.name if s.adapter_version else None for s in sessions
    ]
    result.served_groups = [
        name
        for name in CandidateGroup.objects.filter(
            session__client__simulation__run=served
        ).values_list("adapter_version__name", flat=True)
    ]
    return result


# -- the bench --------------------------------------------------------------------------


def report(plan: LoopPlan, result: LoopResult, model: str) -> str:
    lipo = ", ".join(f"{k} {v}" for k, v in plan.lipo.items() if k != "modalities")
    stages = " | ".join(f"{k} {v:.0f} s" for k, v in result.stages.items())
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.round_phases.items())
    consistency = result.consistent_pairs / result.pairs if result.pairs else 0.0
    checks = ", ".join(f"{k} {v}" for k, v in result.checks.items())
    return (
        f"Model `{model}`, one run of `run_loop` (bench/bench_loop.py; the slow test "
        f"webapp/learning/tests/test_loop_smollm2.py runs the same driver): {plan.clients} "
        f"simulated clients x {plan.sessions} session x up to {plan.max_turns} exchanges, "
        f"N = {plan.candidates} candidates of at most {plan.max_new_tokens} tokens, graph "
        f"mode, the default judge evaluator; then a LiPO round on the scaled-down batch "
        f"({lipo}), a clinician's approval, and a new simulated session of "
        f"{plan.serve_turns} exchanges. Shared 2-core CPU (other jobs running).\n\n"
        f"| figure | value |\n|---|---:|\n"
        f"| counselor turns (of which the crisis safe reply) | {result.turns} "
        f"({result.crisis_turns}) |\n"
        f"| judged turns | {result.judged_turns} |\n"
        f"| order-consistent pairs | {result.consistent_pairs}/{result.pairs} "
        f"({consistency:.0%}) |\n"
        f"| edges | {result.edges} |\n"
        f"| **edges per judged turn** | **{result.edges_per_judged_turn:.2f}** |\n"
        f"| admissible groups | {result.admissible_groups} |\n"
        f"| batch claimed (groups, edges) | {result.batch_groups}, {result.batch_edges} |\n"
        f"| round outcome | {result.outcome} -> {result.version} ({result.version_status}) |\n"
        f"| validation | {checks or '-'} |\n"
        f"| new session pinned / its groups' generating version | "
        f"{', '.join(map(str, result.served_sessions)) or '-'} / "
        f"{', '.join(sorted(set(map(str, result.served_groups)))) or '-'} |\n\n"
        f"Wall time by stage: {stages}. Round phases (`TrainingRun.timings`): {phases or '-'}."
        + (f"\n\nRound error: {result.error}" if result.error else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=LoopPlan.clients)
    parser.add_argument("--turns", type=int, default=LoopPlan.max_turns)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.db import connection

    from counselor_engine.models import MODEL_DIRNAME

    plan = LoopPlan(clients=args.clients, max_turns=args.turns, seed=args.seed)
    connection.settings_dict["TEST"]["NAME"] = f"test_{connection.settings_dict['NAME']}_loopbench"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="psyevo-loop-") as tmp:
            result = run_loop(plan, Path(tmp), say=lambda m: print(m, flush=True))
    finally:
        connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
    body = report(plan, result, MODEL_DIRNAME)
    body += f" Total {time.perf_counter() - started:.0f} s."
    write_section(f"learning loop ({MODEL_DIRNAME})", body)
    print(body)


if __name__ == "__main__":
    main()
