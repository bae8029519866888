"""Simulation run reports: the summary JSON, its SVG plots, and the files on disk.

One summary feeds both the staff page and the file the command writes, so they never
disagree. Plots use matplotlib's object API through ``webapp.lib.plots`` (no pyplot in a
server); the SVG text is built from numbers and our own labels only.

Summary, per run:
- ``sessions``: one row per simulated session (client, profile, intent, interaction
  state, turns, whether the client closed it, crisis, the four metric families, the
  pass/fail of each perspective, the internal session reward for contrast);
- ``by_session``: the mean of each metric family over clients, per session index;
- ``pass_rates``: per perspective, the share of sessions over its pass threshold;
- ``allocation``: how many sessions each of the 24 interaction states got, and with
  ``--curriculum`` the controller's final distribution (mean over intents) and snapshot;
- ``guard``: output-guard rejections (``counselor_engine.output_guard.rejection_counts``)
  per adapter version that generated the run's turns ("base model" for none): candidates
  checked, rejected and their share, fallback turns, rejections per rule.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings
from django.utils import timezone
from matplotlib.figure import Figure

from counselor_engine.output_guard import rejection_counts
from counselor_engine.simulation.interaction import ALL_STATES
from webapp.learning.models import CandidateGroup, SimulationReport, SimulationRun
from webapp.lib import plots

if TYPE_CHECKING:
    from counselor_engine.simulation import CurriculumController

PERSPECTIVES = ("client", "supervisor", "counselor")
# The external judge's four metric families and their mean (0-10); its pass_* entries
# are shown as pass rates instead.
FAMILIES = ("c_shared", "c_spec", "l_shared", "l_spec", "overall")
PLOT_NAMES = ("metrics_by_session", "pass_rates", "allocation")


def report_dir() -> Path:
    """``<PSYEVO_DATA_DIR>/reports/simulations`` unless ``SIMULATION_REPORT_DIR`` is set."""
    configured = getattr(settings, "SIMULATION_REPORT_DIR", None)
    return Path(configured) if configured else Path(settings.DATA_DIR) / "reports" / "simulations"


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarise(run: SimulationRun, controller: CurriculumController | None = None) -> dict[str, Any]:
    reports = list(
        SimulationReport.objects.filter(run=run)
        .select_related("client")
        .order_by("client__pk", "session_index")
    )
    sessions = [
        {
            "client": r.client.user_id,
            "client_index": i,
            "profile": r.client.profile_id,
            "intent": r.client.intent,
            "modality": r.client.modality,
            "session_index": r.session_index,
            "state": r.state_key,
            "turns": r.turns,
            "closed_by_client": r.closed_by_client,
            "crisis": r.crisis,
            "metrics": r.metrics,
            "passed": r.passed,
            "session_reward": r.session_reward,
        }
        for i, r in enumerate(reports)
    ]
    families = [f for f in FAMILIES if any(f in r.metrics for r in reports)]
    by_index: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        for k, v in r.metrics.items():
            if v is not None:
                by_index[r.session_index][k].append(float(v))
    by_session = [
        {"session_index": i, "n": sum(1 for r in reports if r.session_index == i)}
        | {k: _mean(by_index[i][k]) for k in families}
        for i in sorted(by_index)
    ]
    pass_rates: dict[str, float | None] = {}
    for perspective in PERSPECTIVES:
        verdicts = [bool(r.passed[perspective]) for r in reports if perspective in r.passed]
        pass_rates[perspective] = _mean([float(v) for v in verdicts])
    counts = {s.key: 0 for s in ALL_STATES}
    for r in reports:
        counts[r.state_key] = counts.get(r.state_key, 0) + 1
    allocation: dict[str, Any] = {"states": [s.key for s in ALL_STATES], "sessions": counts}
    if controller is not None:
        dist = np.mean([controller.distribution(c) for c in controller.intents], axis=0)
        allocation["distribution"] = [round(float(p), 6) for p in dist]
        allocation["snapshot"] = controller.snapshot()
    return {
        "run": run.pk,
        "parameters": run.parameters,
        "adapter": run.adapter_label,
        "families": families,
        "metric_means": {
            k: _mean([float(r.metrics[k]) for r in reports if r.metrics.get(k) is not None])
            for k in families
        },
        "sessions": sessions,
        "by_session": by_session,
        "pass_rates": pass_rates,
        "allocation": allocation,
        "guard": guard_summary([r.session_id for r in reports]),
    }


BASE_LABEL = "base model"


def guard_summary(session_ids: list[int]) -> dict[str, Any]:
    """Output-guard rejections of the run's counselor turns, per generating version."""
    by_version: dict[str, list[tuple[list[dict[str, Any]], int | None]]] = defaultdict(list)
    rows = (
        CandidateGroup.objects.filter(session_id__in=session_ids)
        .order_by("pk")
        .values_list("guard", "delivered", "adapter_version__name")
    )
    for guard, delivered, version in rows:
        by_version[version or BASE_LABEL].append((guard or [], delivered))
    return {label: rejection_counts(rows) for label, rows in sorted(by_version.items())}


# -- plots ------------------------------------------------------------------------------


def metrics_plot(summary: dict[str, Any]) -> str:
    """Each metric family's mean over clients, per session of the course."""
    fig = Figure(figsize=(6.0, 2.8))
    ax = fig.add_subplot()
    rows = summary["by_session"]
    x = [r["session_index"] + 1 for r in rows]
    for family in summary["families"]:
        y = [np.nan if r.get(family) is None else r[family] for r in rows]
        ax.plot(x, y, marker="o", label=family)
    ax.set_xticks(x)
    ax.set_xlabel("session")
    ax.set_ylabel("mean over clients")
    ax.set_title("Metric families per session", fontsize=9)
    if summary["families"]:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return plots._svg(fig)


def pass_rate_plot(summary: dict[str, Any]) -> str:
    fig = Figure(figsize=(4.0, 2.6))
    ax = fig.add_subplot()
    names = list(summary["pass_rates"])
    values = [np.nan if v is None else 100 * v for v in summary["pass_rates"].values()]
    ax.bar(names, values, color=plots.SKILL_COLORS[: len(names)])
    ax.set_ylim(0, 100)
    ax.set_ylabel("sessions passed (%)")
    ax.set_title("Pass rate per perspective", fontsize=9)
    fig.tight_layout()
    return plots._svg(fig)


def allocation_plot(summary: dict[str, Any]) -> str:
    """Sessions per interaction state; with a curriculum, its final distribution too."""
    allocation = summary["allocation"]
    states = allocation["states"]
    counts = np.array([allocation["sessions"].get(s, 0) for s in states], dtype=float)
    total = counts.sum() or 1.0
    fig = Figure(figsize=(7.5, 2.9))
    ax = fig.add_subplot()
    x = np.arange(len(states))
    ax.bar(x, counts / total, color="#2458a6", label="share of sessions")
    if "distribution" in allocation:
        ax.plot(x, allocation["distribution"], "D", color="#b23a48", label="curriculum p(z)")
    ax.set_xticks(x)
    ax.set_xticklabels(states, rotation=70, ha="right", fontsize=6)
    ax.set_ylabel("share")
    ax.set_title("Allocation over the 24 interaction states", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return plots._svg(fig)


def svgs(summary: dict[str, Any]) -> dict[str, str]:
    return {
        "metrics_by_session": metrics_plot(summary),
        "pass_rates": pass_rate_plot(summary),
        "allocation": allocation_plot(summary),
    }


def page_plots(run: SimulationRun) -> list[plots.Plot]:
    """The three plots for the staff page, cached per run (a finished run never changes)."""
    summary = run.report or {}
    if not summary.get("sessions"):
        return []
    alts = {
        "metrics_by_session": "Mean of each metric family per session",
        "pass_rates": "Share of sessions passing, per perspective",
        "allocation": "Share of sessions per interaction state",
    }
    builders: dict[str, Callable[[dict[str, Any]], str]] = {
        "metrics_by_session": metrics_plot,
        "pass_rates": pass_rate_plot,
        "allocation": allocation_plot,
    }
    out = []
    for name in PLOT_NAMES:
        key = ("simulation", run.pk, name, run.finished_at)
        svg = plots.cached_svg(key, partial(builders[name], summary))
        out.append(plots.as_plot(svg, alts[name]))
    return out


# -- files ------------------------------------------------------------------------------


def write_files(run: SimulationRun, summary: dict[str, Any]) -> Path:
    """``report.json`` and the SVGs under ``report_dir()/run-<id>/``; written into a
    hidden sibling and renamed, so a folder that exists is complete."""
    folder = report_dir() / f"run-{run.pk}"
    staging = folder.parent / f".{folder.name}.partial"
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    for name, svg in svgs(summary).items():
        (staging / f"{name}.svg").write_text(svg)
    if folder.exists():
        raise FileExistsError(f"{folder} exists: reports are never overwritten")
    staging.rename(folder)
    return folder


def finish(run: SimulationRun, controller: CurriculumController | None) -> None:
    """Summarise, write the files, mark the run succeeded (in that order: a run marked
    succeeded always has its report)."""
    summary = summarise(run, controller)
    folder = write_files(run, summary)
    SimulationRun.objects.filter(pk=run.pk).update(
        status=SimulationRun.Status.SUCCEEDED,
        report=summary,
        report_path=str(folder),
        finished_at=timezone.now(),
    )
