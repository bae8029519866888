"""Hierarchical Bayesian Skill Policy (paper, Sec. 2.2, Eq. 2-4 and App. C.1).

The selection score of skill a in state s for client u is the shared prior Q(s, a) plus a
client-private residual b_u(s, a) ~ N(m, 1/lambda). Each turn draws the residuals (posterior
sampling, Eq. 2), mixes the softmax with uniform exploration over the valid skills (Eq. 3),
and samples a skill. After the session each selected cell is updated with the residual of
its trajectory return against Q (Eq. 4). Q itself never changes here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from counselor_engine import _validate
from counselor_engine.skills import SKILLS, Skill
from counselor_engine.states import ALL_SLOTS

PRIOR_MEAN = 0.0
PRIOR_PRECISION = 4.0  # residual prior variance 0.25
OBS_VARIANCE = 1.0
TAU = 1.0
EPSILON = 0.05

_SLOTS = frozenset(ALL_SLOTS)
_SLOT_ORDER = {slot: i for i, slot in enumerate(ALL_SLOTS)}


def skill_probabilities(
    shared_values: Sequence[float] | np.ndarray,
    draws: Sequence[float] | np.ndarray,
    *,
    tau: float = TAU,
    epsilon: float = EPSILON,
    valid: Sequence[bool] | np.ndarray | None = None,
) -> np.ndarray:
    """Eq. 3: p(a) = (1 - eps) * softmax(tau * (Q + b~))(a) + eps / |A|.

    ``shared_values`` and ``draws`` are aligned over the skills. ``tau`` multiplies the
    scores (it is not a divisor); ``tau = 0`` gives the uniform distribution, a negative
    value is refused because it would invert preferences. With ``valid`` (a boolean mask),
    the softmax and the uniform exploration both run over the valid skills only and every
    other skill gets exactly 0, as the paper's excluded skills do.
    """
    q = _validate.vector("shared_values", shared_values)
    b = _validate.vector("draws", draws)
    if q.shape != b.shape:
        raise ValueError(f"draws: length {b.size} does not match shared_values ({q.size})")
    tau = _validate.nonnegative("tau", tau)
    epsilon = _validate.unit("epsilon", epsilon)
    mask = _valid_mask(valid, q.size)
    out = np.zeros_like(q)
    out[mask] = _eq3((q[mask] + b[mask]).tolist(), tau, epsilon)
    return out


def _eq3(scores: Sequence[float], tau: float, epsilon: float) -> list[float]:
    """Eq. 3 on already-checked finite scores Q + b~ of the valid skills.

    Plain Python: with at most a few dozen skills this beats numpy's per-call overhead.
    """
    scaled = [tau * x for x in scores]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]  # shift by the max: no overflow
    total = sum(weights)
    explore = epsilon / len(weights)
    return [(1.0 - epsilon) * w / total + explore for w in weights]


def _valid_mask(valid: Sequence[bool] | np.ndarray | None, size: int) -> np.ndarray:
    if valid is None:
        return np.ones(size, dtype=bool)
    mask = np.asarray(valid)
    if mask.dtype != np.bool_ or mask.shape != (size,):
        raise ValueError(f"valid: expected {size} booleans aligned with shared_values")
    if not mask.any():
        raise ValueError("valid: no valid skill")
    return mask


def posterior_update(
    mean: float, precision: float, residual: float, *, obs_variance: float = OBS_VARIANCE
) -> tuple[float, float]:
    """Eq. 4: the conjugate normal update of one cell; returns ``(mean', precision')``.

    lambda' = lambda + 1/sigma^2 and m' = (lambda m + d / sigma^2) / lambda'.
    """
    mean = _validate.finite("mean", mean)
    precision = _validate.positive("precision", precision)
    residual = _validate.finite("residual", residual)
    obs_precision = 1.0 / _validate.positive("obs_variance", obs_variance)
    new_precision = precision + obs_precision
    return (precision * mean + obs_precision * residual) / new_precision, new_precision


@dataclass(frozen=True)
class Cell:
    """One client-private posterior cell: b(s, a) ~ N(mean, 1/precision) after n updates."""

    mean: float
    precision: float
    n: int = 0

    @property
    def sd(self) -> float:
        return 1.0 / math.sqrt(self.precision)


@dataclass(frozen=True)
class SkillRecord:
    """What one skill looked like at decision time (App. C.1: inspectable decisions)."""

    probability: float
    mean: float
    sd: float
    draw: float
    shared_value: float


@dataclass(frozen=True)
class Decision:
    """One skill decision, with a record for every valid skill.

    ``pinned`` is True when a clinician pin forced ``chosen``: then its probability is 1
    and every other skill's is 0 (the draws are still recorded).
    """

    state: str
    chosen: str
    records: dict[str, SkillRecord]
    pinned: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "chosen": self.chosen,
            "pinned": self.pinned,
            "records": {skill: asdict(record) for skill, record in self.records.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        records = {s: SkillRecord(**r) for s, r in dict(data["records"]).items()}
        return cls(str(data["state"]), str(data["chosen"]), records, bool(data["pinned"]))


@dataclass(frozen=True)
class PosteriorUpdate:
    """The audit record of one Eq. 4 update: what changed, and why."""

    state: str
    skill: str
    G: float
    shared_value: float
    residual: float
    mean_before: float
    precision_before: float
    mean_after: float
    precision_after: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SkillPosterior:
    """One client's private residual posterior over (state slot, skill) cells.

    Cells never touched are at the prior (mean 0, precision 4) and are not stored. The
    shared table Q is passed in per call and never modified here.
    """

    def __init__(
        self, *, prior_precision: float = PRIOR_PRECISION, obs_variance: float = OBS_VARIANCE
    ) -> None:
        self.prior_precision = _validate.positive("prior_precision", prior_precision)
        self.obs_variance = _validate.positive("obs_variance", obs_variance)
        self._cells: dict[tuple[str, str], Cell] = {}

    def cell(self, state: str, skill: str) -> Cell:
        """The current cell (the prior for a cell never updated)."""
        key = (_check_state(state), _check_skill(skill).id)
        return self._cells.get(key) or Cell(PRIOR_MEAN, self.prior_precision, 0)

    def cells(self) -> dict[tuple[str, str], Cell]:
        """Every updated cell, keyed (state, skill); a copy."""
        return dict(self._cells)

    def decide(
        self,
        state: str,
        valid_skills: Sequence[str],
        shared_table: Mapping[str, float],
        rng: np.random.Generator,
        *,
        pinned: str | None = None,
        tau: float = TAU,
        epsilon: float = EPSILON,
    ) -> Decision:
        """Sample the skill for one turn.

        ``valid_skills`` are the client's modality's skills minus any the clinician
        excluded; ``shared_table`` maps each of them to Q(state, skill), e.g.
        ``PriorTable.for_state(modality, state)``.

        1. Read each valid skill's cell (mean m, sd 1/sqrt(lambda)).
        2. Draw b~ ~ N(m, 1/lambda) per skill (Eq. 2), before the mixture.
        3. p = Eq. 3 over the valid skills (uniform exploration over them only).
        4. Sample the skill from p with ``rng``. A clinician pin (a product rule beyond
           the paper) replaces p by certainty on the pinned skill; it must be valid.
        """
        skills = self._check_valid(state, valid_skills, pinned)
        q = _shared_values(shared_table, skills)
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng: expected a numpy.random.Generator")
        tau = _validate.nonnegative("tau", tau)
        epsilon = _validate.unit("epsilon", epsilon)
        prior = Cell(PRIOR_MEAN, self.prior_precision)
        cells = [self._cells.get((state, skill), prior) for skill in skills]
        means = [cell.mean for cell in cells]
        sds = [cell.sd for cell in cells]
        noise = rng.standard_normal(len(skills)).tolist()
        draws = [m + sd * z for m, sd, z in zip(means, sds, noise, strict=True)]
        if pinned is None:
            probs = _eq3([v + d for v, d in zip(q, draws, strict=True)], tau, epsilon)
            chosen = skills[_sample_index(probs, rng.random())]
        else:
            probs = [1.0 if skill == pinned else 0.0 for skill in skills]
            chosen = pinned
        columns = zip(skills, probs, means, sds, draws, q, strict=True)
        records = {s: SkillRecord(p, m, sd, d, v) for s, p, m, sd, d, v in columns}
        return Decision(state, chosen, records, pinned is not None)

    def _check_valid(
        self, state: str, valid_skills: Sequence[str], pinned: str | None
    ) -> list[str]:
        _check_state(state)
        if isinstance(valid_skills, str) or not valid_skills:
            raise ValueError("valid_skills: expected a non-empty sequence of skill ids")
        skills = _validate.distinct("valid_skills", valid_skills)
        modalities = {_check_skill(s, "valid_skills").modality for s in skills}
        if len(modalities) != 1:
            raise ValueError(f"valid_skills: skills span several modalities {sorted(modalities)}")
        if pinned is not None and pinned not in skills:
            raise ValueError(f"pinned: {pinned!r} is not among the valid skills")
        return skills

    def update(self, state: str, skill: str, G: float, shared_value: float) -> PosteriorUpdate:
        """Eq. 4 on the one cell (state, skill), with residual d = G - Q(state, skill).

        ``G`` is the SOCA trajectory return (Eq. 9) credited to this decision; it need not
        lie in [0, 1]. No other cell changes, and there is no rescaling step (App. C.1).
        """
        before = self.cell(state, skill)
        G = _validate.finite("G", G)
        shared_value = _validate.finite("shared_value", shared_value)
        residual = G - shared_value
        mean, precision = posterior_update(
            before.mean, before.precision, residual, obs_variance=self.obs_variance
        )
        after = Cell(mean, precision, before.n + 1)
        self._cells[(state, skill)] = after
        return PosteriorUpdate(
            state, skill, G, shared_value, residual,
            before.mean, before.precision, after.mean, after.precision, after.n,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready storage form; cells in slot order, then skill id."""
        keys = sorted(self._cells, key=lambda k: (_SLOT_ORDER[k[0]], k[1]))
        return {
            "format": 1,
            "prior_precision": self.prior_precision,
            "obs_variance": self.obs_variance,
            "cells": [{"state": s, "skill": a, **asdict(self._cells[(s, a)])} for s, a in keys],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SkillPosterior:
        """Inverse of :meth:`to_dict`; ValueError on any bad cell."""
        if data.get("format") != 1:
            raise ValueError("data: unknown posterior format")
        posterior = cls(
            prior_precision=data.get("prior_precision", PRIOR_PRECISION),
            obs_variance=data.get("obs_variance", OBS_VARIANCE),
        )
        for item in data.get("cells", []):
            key = (
                _check_state(item.get("state"), "data"),
                _check_skill(item.get("skill"), "data").id,
            )
            if key in posterior._cells:
                raise ValueError(f"data: duplicate cell {key}")
            posterior._cells[key] = Cell(
                _validate.finite("data.mean", item.get("mean")),
                _validate.positive("data.precision", item.get("precision")),
                _validate.integer("data.n", item.get("n"), minimum=0),
            )
        return posterior


def shared_only_decision(
    state: str,
    valid_skills: Sequence[str],
    shared_table: Mapping[str, float],
    rng: np.random.Generator,
    *,
    pinned: str | None = None,
    tau: float = TAU,
    epsilon: float = EPSILON,
) -> Decision:
    """No-HBSP ablation (Table 3, ``CounselorConfig.use_hbsp = False``): Eq. 3 over the
    shared table Q with the client residuals removed (b = 0, sd 0), so the choice depends
    on Q, the state and the exploration only. No residual is drawn, so ``rng`` gives one
    uniform per turn."""
    skills = list(valid_skills)
    q = _shared_values(shared_table, skills)  # the same read and checks as decide()
    if pinned is None:
        probs = [float(p) for p in skill_probabilities(q, [0.0] * len(q), tau=tau, epsilon=epsilon)]
        chosen = skills[_sample_index(probs, rng.random())]
    else:
        if pinned not in skills:
            raise ValueError(f"pinned: {pinned!r} is not among the valid skills")
        probs = [1.0 if s == pinned else 0.0 for s in skills]
        chosen = pinned
    records = {
        s: SkillRecord(p, 0.0, 0.0, 0.0, v) for s, p, v in zip(skills, probs, q, strict=True)
    }
    return Decision(state, chosen, records, pinned is not None)


def _check_state(state: Any, name: str = "state") -> str:
    if not isinstance(state, str) or state not in _SLOTS:
        raise ValueError(f"{name}: unknown state slot {state!r}")
    return state


def _check_skill(skill: Any, name: str = "skill") -> Skill:
    found = SKILLS.get(skill) if isinstance(skill, str) else None
    if found is None:
        raise ValueError(f"{name}: unknown skill {skill!r}")
    return found


def _shared_values(shared_table: Mapping[str, float], skills: list[str]) -> list[float]:
    """Q(state, skill) for each valid skill, as finite floats."""
    if not isinstance(shared_table, Mapping):
        raise ValueError("shared_table: expected a mapping skill id -> Q(state, skill)")
    missing = [s for s in skills if s not in shared_table]
    if missing:
        raise ValueError(f"shared_table: no value for skills {missing}")
    values = [shared_table[s] for s in skills]
    if all(type(v) is float and math.isfinite(v) for v in values):
        return values  # the common case, checked without building messages
    return [
        _validate.finite(f"shared_table[{s!r}]", v) for s, v in zip(skills, values, strict=True)
    ]


def _sample_index(probs: list[float], u: float) -> int:
    """Inverse-CDF sampling of one index from ``probs`` with a uniform ``u`` in [0, 1)."""
    target = u * sum(probs)
    cumulative = 0.0
    for index, p in enumerate(probs):
        cumulative += p
        if target < cumulative:
            return index
    return len(probs) - 1  # only reachable through rounding in the last place
