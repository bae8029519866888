"""The arena check of a training round: candidate vs the active version, simulated.

It runs the simulation lab's headless course runner
(``counselor_engine.simulation.run_course``, the code ``manage.py simulate`` is built on)
twice on the same small, fixed set of simulated clients: once with the counselor under
the active version (or the base model when none is active), once under the candidate.
Everything else is held equal: the same profiles (the first ``clients`` built-in
profiles taken round-robin over modalities), the same seeds and therefore the same
interaction states, and the same simulated-client and external-judge model (the base
model, no adapter). Only the counselor's adapter differs.

Rule (issue 8; the paper gives none): for each metric family
``f in (c_shared, c_spec, l_shared, l_spec, overall)`` (0-10, the external judge's),
take the mean over all simulated sessions, ``m_f(version)``. The candidate passes when
``m_f(candidate) >= m_f(active) - tolerance`` for every family whose both means exist;
families with no applicable item on either side are ignored; with no comparable family
at all the check fails (nothing was measured). The default tolerance is 0.5 points
(5% of the scale): small samples of a stochastic judge differ by that much with no
real change, and a clinician still reads the side-by-side replies before approving.

The external scores decide only whether a version is offered for approval; they never
enter posteriors, evidence or losses (paper App. G).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from counselor_engine.lipo.config import LipoConfig

log = logging.getLogger(__name__)

FAMILIES = ("c_shared", "c_spec", "l_shared", "l_spec", "overall")
ACTIVE, CANDIDATE = "arena-active", "arena-candidate"


@dataclass(frozen=True)
class ArenaSpec:
    """What the arena loads: the base model and the two adapter folders."""

    model_path: Path
    active_path: Path | None  # None: the base model is what serves now
    active_name: str | None
    candidate_path: Path
    candidate_name: str
    # The active version's approved digest: the backend hashes its snapshot again right
    # before loading it (``servable_path`` wrote it from verified bytes).
    active_sha256: str = ""


def profiles(count: int) -> list[Any]:
    """The first ``count`` built-in profiles, one modality after another (fixed)."""
    from counselor_engine.simulation import builtin_profiles

    by_modality: dict[str, list[Any]] = {}
    for profile in builtin_profiles():
        by_modality.setdefault(profile.modality, []).append(profile)
    order: list[Any] = []
    depth = max((len(v) for v in by_modality.values()), default=0)
    for i in range(depth):
        order.extend(v[i] for v in by_modality.values() if i < len(v))
    return order[:count]


def compare(
    active: dict[str, float | None], candidate: dict[str, float | None], tolerance: float
) -> tuple[bool, list[str], list[str]]:
    """The rule above: (passed, families compared, families that dropped too far)."""
    compared, dropped = [], []
    for family in FAMILIES:
        a, c = active.get(family), candidate.get(family)
        if a is None or c is None:
            continue
        compared.append(family)
        if c < a - tolerance:
            dropped.append(family)
    return bool(compared) and not dropped, compared, dropped


def family_means(sessions: Sequence[Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for family in FAMILIES:
        values = [
            float(v)
            for s in sessions
            if s.report is not None
            and (v := s.report.metrics.get(family)) is not None
            and math.isfinite(float(v))
        ]
        out[family] = float(np.mean(values)) if values else None
    return out


async def _play(
    spec: ArenaSpec, config: LipoConfig
) -> tuple[dict[str, dict[str, float | None]], dict[str, dict[str, Any]]]:
    """Family means per version, and the output guard's rejections per version over
    every counselor candidate of the arena (reported, not gating: sampled candidates
    of a few sessions vary too much; the validation report's ``output_guard`` check
    gates on greedy replies instead)."""
    from counselor_engine.backends import make_backend
    from counselor_engine.counselor import CounselorConfig, default_generation
    from counselor_engine.output_guard import rejection_counts
    from counselor_engine.simulation import run_course

    backend = make_backend("transformers", model_path=str(spec.model_path))
    await backend.load_adapter(CANDIDATE, str(spec.candidate_path))
    if spec.active_path is not None:
        await backend.load_adapter(ACTIVE, str(spec.active_path), sha256=spec.active_sha256)
    counselor = CounselorConfig(
        n_candidates=config.arena_candidates,
        generation=replace(default_generation(), max_new_tokens=config.side_by_side_tokens),
        seed=config.seed,
    )
    results: dict[str, dict[str, float | None]] = {}
    guard: dict[str, dict[str, Any]] = {}
    for label, adapter in (
        ("active", ACTIVE if spec.active_path is not None else None),
        ("candidate", CANDIDATE),
    ):
        sessions = []
        for i, profile in enumerate(profiles(config.arena_clients)):
            course = await run_course(
                backend,
                backend,
                profile,
                sessions=config.arena_sessions,
                max_turns=config.arena_turns,
                curriculum=None,
                rng=np.random.default_rng([config.seed, i]),  # same states for both
                judge_backend=backend,
                counselor_config=counselor,
                adapter=adapter,
            )
            sessions.extend(course.sessions)
        results[label] = family_means(sessions)
        guard[label] = rejection_counts((g.guard, g.delivered) for s in sessions for g in s.groups)
    return results, guard


def arena_check(spec: ArenaSpec | None, config: LipoConfig) -> dict[str, Any]:
    """The validation report's ``arena`` entry (see the module docstring for the rule)."""
    if spec is None or config.arena_clients == 0:
        return {
            "name": "arena",
            "passed": True,
            "skipped": True,
            "detail": "arena disabled for this round (no simulated clients configured)",
        }
    results, guard = asyncio.run(_play(spec, config))
    passed, compared, dropped = compare(
        results["active"], results["candidate"], config.arena_tolerance
    )
    if not compared:
        detail = "no metric family could be compared (no applicable judge items)"
    elif dropped:
        detail = f"candidate worse than {config.arena_tolerance:g} points on: {', '.join(dropped)}"
    else:
        overall = results["candidate"].get("overall"), results["active"].get("overall")
        detail = (
            f"not worse beyond {config.arena_tolerance:g} points on {len(compared)} families"
            + (f" (overall {overall[0]:.2f} vs {overall[1]:.2f})" if None not in overall else "")
        )
    return {
        "name": "arena",
        "passed": passed,
        "detail": detail,
        "active_version": spec.active_name or "base model",
        "candidate_version": spec.candidate_name,
        "active": results["active"],
        "candidate": results["candidate"],
        "tolerance": config.arena_tolerance,
        "clients": config.arena_clients,
        "sessions": config.arena_sessions,
        "turns": config.arena_turns,
        "families_dropped": dropped,
        "guard": guard,
    }
