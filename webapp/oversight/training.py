"""Training runs and adapter lineage for the admin console (read-only views of
``webapp.learning``'s rows; the approval gate itself lives there)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.lib import plots


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def loss_rows(run: TrainingRun) -> list[dict[str, float | None]]:
    """``loss_curve`` as rows {step, loss, grad_norm}; the worker writes dicts, plain
    numbers (one loss per step) are read too."""
    rows = []
    for i, point in enumerate(run.loss_curve or [], start=1):
        if isinstance(point, dict):
            rows.append(
                {
                    "step": _number(point.get("step")) or float(i),
                    "loss": _number(point.get("loss")),
                    "grad_norm": _number(point.get("grad_norm")),
                }
            )
        else:
            rows.append({"step": float(i), "loss": _number(point), "grad_norm": None})
    return rows


def loss_points(run: TrainingRun) -> tuple[list[float], list[float | None]]:
    rows = loss_rows(run)
    return [r["step"] or 0.0 for r in rows], [r["loss"] for r in rows]


def loss_plot(run: TrainingRun) -> plots.Plot | None:
    steps, losses = loss_points(run)
    if not steps:
        return None
    svg = plots.cached_svg(
        ("loss", run.pk, run.created_at.timestamp(), len(steps), run.status),
        lambda: plots.loss_curve(steps, losses, f"Training run {run.pk}"),
    )
    return plots.as_plot(svg, f"LiPO loss per optimiser step of run {run.pk}")


def shares(run: TrainingRun) -> list[tuple[str, float]]:
    data = run.modality_shares or {}
    return sorted(((str(k), float(v)) for k, v in data.items() if isinstance(v, int | float)))


def duration(run: TrainingRun) -> timedelta | None:
    if run.started_at and run.finished_at:
        return run.finished_at - run.started_at
    return None


@dataclass(frozen=True)
class LineageRow:
    version: AdapterVersion
    depth: int
    run: TrainingRun | None


def lineage(versions: list[AdapterVersion]) -> list[LineageRow]:
    """Versions in tree order (each after the one it was trained from), with depth."""
    children: dict[int | None, list[AdapterVersion]] = {}
    ids = {v.pk for v in versions}
    for v in versions:
        parent = v.parent_id if v.parent_id in ids else None
        children.setdefault(parent, []).append(v)
    runs: dict[Any, TrainingRun] = {
        r.output_version_id: r
        for r in TrainingRun.objects.filter(output_version__in=versions).select_related(
            "started_by"
        )
    }
    rows: list[LineageRow] = []
    stack = [(v, 0) for v in reversed(children.get(None, []))]
    while stack:
        version, depth = stack.pop()
        rows.append(LineageRow(version, depth, runs.get(version.pk)))
        stack.extend((c, depth + 1) for c in reversed(children.get(version.pk, [])))
    return rows
