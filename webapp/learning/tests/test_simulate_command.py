"""``manage.py simulate`` on the tiny model: the product's session path, the report,
bad arguments, failures, and reward separation (paper App. G)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from counselor_engine.safety import registry
from counselor_engine.simulation import ExternalReport, PerspectiveScore
from webapp.accounts.models import ClientProfile, User
from webapp.counseling.models import Session, Turn
from webapp.learning import simlab
from webapp.learning.models import (
    CandidateGroup,
    LearningScope,
    PosteriorCell,
    PosteriorUpdate,
    SimulationReport,
    SimulationRun,
    TrainingRun,
)
from webapp.oversight.models import SafetyFlag

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(tiny_engine, settings, tmp_path):  # type: ignore[no-untyped-def]
    """The tiny model, short replies, reports in a temporary folder. The simulated client
    is the tiny model too, whose messages are token soup: the learned crisis layer reads
    such text arbitrarily (round 10 read some of it as crisis), so the rules answer alone
    here; the lab's crisis path has its own test below."""
    settings.PSYEVO_CANDIDATES = 2
    settings.PSYEVO_MAX_NEW_TOKENS = 8
    settings.SIMULATION_REPORT_DIR = tmp_path / "reports"
    registry.set_model_for_tests(None)
    yield settings
    registry.reset()


class ReadsEverythingAsCrisis:
    """A crisis model that reads every message as a crisis (tests only)."""

    encoder = "stub"

    def level(self, norm: str) -> tuple[str, float, float]:
        return "crisis", 0.99, 0.99


def test_a_simulated_crisis_is_reported_and_never_alerted(lab):  # type: ignore[no-untyped-def]
    """The safe reply answers the simulated client as it would a person; the report says
    so; no clinician is alerted for a synthetic client, and no posterior learns from it."""
    registry.set_model_for_tests(ReadsEverythingAsCrisis())  # type: ignore[arg-type]
    simulate("--clients", "1", "--sessions", "1", "--max-turns", "1", "--adapter", "base")
    run = SimulationRun.objects.get()
    assert run.status == "succeeded", run.error
    report = SimulationReport.objects.get(run=run)
    assert report.crisis is True
    session = Session.objects.get(client__simulation__run=run)
    reply = session.turns.get(role=Turn.Role.COUNSELOR)
    assert reply.safety_level == "crisis"
    assert not SafetyFlag.objects.exists()
    assert not CandidateGroup.objects.filter(session=session).exists()


def simulate(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


class FixedJudge:
    """An external judge that gives every item the same score (tests only)."""

    def __init__(self, value: float) -> None:
        self.value = value

    async def evaluate(self, profile: Any, transcript: Any) -> ExternalReport:
        scores = tuple(
            PerspectiveScore(p, self.value * n, 4.0 * n, t, self.value * n > t, {"x": self.value})
            for p, n, t in (("client", 16, 42.0), ("supervisor", 8, 24.0), ("counselor", 9, 35.0))
        )
        metrics = {f: 2.5 * self.value for f in ("c_shared", "c_spec", "l_shared", "l_spec")}
        metrics["overall"] = 2.5 * self.value
        return ExternalReport(scores, metrics)


def test_it_runs_courses_through_the_session_services_and_writes_the_report(lab):  # type: ignore[no-untyped-def]
    # Three turns: two judged outcomes, the fewest that may update a posterior (H.7).
    out = simulate("--clients", "2", "--sessions", "1", "--max-turns", "3", "--adapter", "base")

    run = SimulationRun.objects.get()
    assert run.status == "succeeded" and run.error == ""
    assert run.parameters["clients"] == 2 and run.adapter is None
    # Stored like real sessions: ended, with turns, rewards, decisions and evidence.
    sessions = Session.objects.filter(client__simulation__run=run)
    assert sessions.count() == 2
    for session in sessions:
        assert session.status == "ended" and session.session_reward is not None
        assert session.turns.filter(role=Turn.Role.COUNSELOR).count() >= 1
    assert PosteriorUpdate.objects.filter(session__in=sessions).exists()
    groups = CandidateGroup.objects.filter(session__in=sessions)
    assert groups.exists()
    # Simulated evidence is kept apart: no training consent, never in the buffer.
    assert set(groups.values_list("buffer_status", flat=True)) == {"excluded"}
    # The simulated accounts cannot log in and belong to no clinician.
    for user in User.objects.filter(simulation__run=run):
        assert not user.is_active and not user.has_usable_password()
        assert user.client_profile.simulated and user.client_profile.clinician is None
    # One external report per session; the summary and the files.
    assert SimulationReport.objects.filter(run=run).count() == 2
    folder = Path(run.report_path)
    assert f"report: {folder}" in out
    summary = json.loads((folder / "report.json").read_text())
    assert summary == run.report
    assert len(summary["sessions"]) == 2
    assert set(summary["pass_rates"]) == {"client", "supervisor", "counselor"}
    assert sum(summary["allocation"]["sessions"].values()) == 2
    assert len(summary["allocation"]["states"]) == 24
    # Every counselor candidate of the run was checked by the output guard.
    guard = summary["guard"]["base model"]
    assert guard["turns"] == groups.count() and guard["candidates"] == 2 * groups.count()
    for name in ("metrics_by_session", "pass_rates", "allocation"):
        assert (folder / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    # Nothing of the lab moved the shared training scheduler.
    assert not TrainingRun.objects.exists()
    scope = LearningScope.objects.filter(name="default").first()
    assert scope is None or scope.completed_sessions == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--clients", "0"], "--clients"),
        (["--sessions", "0"], "--sessions"),
        (["--max-turns", "0"], "--max-turns"),
        (["--seed", "-1"], "--seed"),
        (["--strategy", "beam"], "--strategy"),
        (["--ablation", "no_memory"], "--ablation"),
        (["--adapter", "v404"], "no adapter version"),
        (["--ablation", "pairwise_dpo"], "--allow-training"),
        (["--ablation", "no_lipo", "--allow-training"], "no_lipo"),
    ],
)
def test_bad_arguments_stop_before_anything_is_written(lab, args, message):  # type: ignore[no-untyped-def]
    with pytest.raises(CommandError, match=message):
        simulate(*args)
    assert not SimulationRun.objects.exists()
    assert not ClientProfile.objects.filter(simulated=True).exists()


def test_the_lab_drives_every_turn_and_its_adapter_through_the_turn_api(  # type: ignore[no-untyped-def]
    lab, tiny_model_dir, tmp_path, monkeypatch
):
    """One home for the turn (issue 17): each simulated message goes through
    ``turns.client_message``, each session end through ``turns.end_session``, and the run's
    adapter is verified and loaded only by the turn path (``load_pinned_adapter``, with
    the approved digest), never by the lab itself."""
    from counselor_engine.backends.tiny import build_tiny_adapter
    from webapp.counseling import runtime, turns
    from webapp.learning.tests.helpers import make_version

    version = make_version("v-lab", "approved", build_tiny_adapter(tiny_model_dir, tmp_path / "a"))
    seen: dict[str, list[Any]] = {"message": [], "end": [], "pinned": [], "load": []}

    def spy(name: str, real: Any) -> Any:
        if name == "message":

            async def messages(msg: Any, **kwargs: Any) -> Any:
                seen[name].append(msg.session_id)
                async for event in real(msg, **kwargs):
                    yield event

            return messages

        async def call(*args: Any, **kwargs: Any) -> Any:
            seen[name].append((args, kwargs))
            return await real(*args, **kwargs)

        return call

    monkeypatch.setattr(turns, "client_message", spy("message", turns.client_message))
    monkeypatch.setattr(turns, "end_session", spy("end", turns.end_session))
    monkeypatch.setattr(turns, "load_pinned_adapter", spy("pinned", turns.load_pinned_adapter))
    load = runtime.LazyBackend.load_adapter
    monkeypatch.setattr(runtime.LazyBackend, "load_adapter", spy("load", load))

    simulate("--clients", "1", "--sessions", "2", "--max-turns", "2", "--adapter", "v-lab")

    run = SimulationRun.objects.get()
    assert run.status == "succeeded", run.error
    sessions = Session.objects.filter(client__simulation__run=run).order_by("index")
    client_turns = Turn.objects.filter(session__in=sessions, role=Turn.Role.CLIENT)
    assert sorted(seen["message"]) == sorted(client_turns.values_list("session_id", flat=True))
    assert len(seen["message"]) == 4
    assert [args[0] for args, _ in seen["end"]] == [s.pk for s in sessions]
    assert all(s.adapter_version_id == version.pk for s in sessions)
    # Loaded once per answered turn, each time by the turn path, with the digest.
    assert len(seen["pinned"]) == len(seen["load"]) == 4
    assert all(args[0].pk == version.pk for args, _ in seen["pinned"])
    assert all(
        args[1] == "v-lab" and kwargs["sha256"] == version.approved_sha256
        for args, kwargs in seen["load"]
    )


def test_an_unapproved_adapter_is_refused(lab, tmp_path):  # type: ignore[no-untyped-def]
    from webapp.learning.tests.helpers import make_version, write_adapter_files

    make_version("v9", "pending_approval", write_adapter_files(tmp_path / "v9"))
    with pytest.raises(CommandError, match="cannot serve"):
        simulate("--adapter", "v9")
    assert not SimulationRun.objects.exists()


def test_a_run_that_fails_midway_is_marked_failed_with_its_reason(
    broken_engine, settings, tmp_path
):  # type: ignore[no-untyped-def]
    settings.SIMULATION_REPORT_DIR = tmp_path / "reports"
    with pytest.raises(CommandError, match="simulation failed"):
        simulate("--clients", "1", "--sessions", "1", "--max-turns", "1", "--adapter", "base")
    run = SimulationRun.objects.get()
    assert run.status == "failed" and run.finished_at is not None
    assert run.error and run.report is None and run.report_path == ""
    assert not Session.objects.filter(client__simulation__run=run, status="open").exists()
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def _learning_state(run: SimulationRun) -> dict[str, Any]:
    """Everything learning wrote for a run's clients, without database ids."""
    cells = PosteriorCell.objects.filter(client__simulation__run=run)
    updates = PosteriorUpdate.objects.filter(session__client__simulation__run=run)
    groups = CandidateGroup.objects.filter(client__simulation__run=run)
    return {
        "cells": sorted(
            cells.values_list(
                "client__simulation__profile_id", "state_slot", "skill", "mean", "precision", "n"
            )
        ),
        "updates": sorted(
            updates.values_list(
                "session__index",
                "cell__state_slot",
                "cell__skill",
                "mean_after",
                "precision_after",
                "residual",
                "credit",
            )
        ),
        "groups": sorted(
            (
                g.session.index,
                g.state_slot,
                g.skill,
                json.dumps(g.candidates),
                json.dumps(g.edges),
                json.dumps(g.pointwise),
                g.delivered,
                g.buffer_status,
            )
            for g in groups.select_related("session")
        ),
        "rewards": sorted(
            Session.objects.filter(client__simulation__run=run).values_list(
                "index", "session_reward", "internal_reward"
            )
        ),
        "states": sorted(
            SimulationReport.objects.filter(run=run).values_list("session_index", "state_key")
        ),
    }


def test_external_scores_never_reach_posteriors_evidence_or_the_curriculum(lab, monkeypatch):  # type: ignore[no-untyped-def]
    """The paper's audit (App. G): two runs with the same seed under external judges that
    disagree completely write identical learning state; only the reports differ."""
    args = ("--clients", "1", "--sessions", "2", "--max-turns", "3", "--adapter", "base",
            "--curriculum", "--seed", "7")  # fmt: skip
    monkeypatch.setattr(simlab, "make_judge", lambda backend: FixedJudge(0.0))
    simulate(*args)
    monkeypatch.setattr(simlab, "make_judge", lambda backend: FixedJudge(4.0))
    simulate(*args)

    low, high = SimulationRun.objects.order_by("pk")
    assert _learning_state(low) == _learning_state(high)
    assert _learning_state(low)["updates"] and _learning_state(low)["groups"]
    assert low.report["pass_rates"] == {"client": 0.0, "supervisor": 0.0, "counselor": 0.0}
    assert high.report["pass_rates"] == {"client": 1.0, "supervisor": 1.0, "counselor": 1.0}
    assert low.report["metric_means"]["overall"] == 0.0
    assert high.report["metric_means"]["overall"] == 10.0


def test_no_hbsp_leaves_the_private_posteriors_untouched(lab):  # type: ignore[no-untyped-def]
    simulate("--clients", "1", "--sessions", "1", "--max-turns", "2", "--adapter", "base",
             "--ablation", "no_hbsp")  # fmt: skip
    run = SimulationRun.objects.get()
    assert run.status == "succeeded" and run.ablation == ["no_hbsp"]
    assert Session.objects.filter(client__simulation__run=run, status="ended").count() == 1
    assert not PosteriorUpdate.objects.filter(session__client__simulation__run=run).exists()


def test_the_mctsr_strategy_stores_each_turns_search_with_its_evidence(lab):  # type: ignore[no-untyped-def]
    simulate("--clients", "1", "--sessions", "1", "--max-turns", "1", "--adapter", "base",
             "--strategy", "mctsr")  # fmt: skip
    run = SimulationRun.objects.get()
    assert run.status == "succeeded", run.error
    groups = list(CandidateGroup.objects.filter(session__client__simulation__run=run))
    assert groups
    for group in groups:
        assert group.mode == "graph"
        search = group.search
        assert search is not None and search["strategy"] == "mctsr"
        assert search["node_count"] >= len(group.candidates)
        assert search["calls_used"] <= search["max_calls"]
        texts = {node["text"] for node in search["nodes"]}
        assert set(group.candidates) <= texts  # the candidates are nodes of the tree
