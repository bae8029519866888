"""Curriculum over interaction states (dual-loop curriculum paper, Sec. 3.4-3.5).

For each support intent c the controller keeps, per interaction state z, the evidence
(S_{c,z}, N_{c,z}) and turns it into the next state distribution p_t(z | c):

1. Group feedback (Sec. 3.4): for a group of K rewards under one (c, z),
   y_k = 1[R_k >= eta] and p_m = (1/K) sum_k y_k. Then S_{c,z} += p_m and N_{c,z} += 1.
2. Leave-one-intent-out pooling (Sec. 3.5): S_z^{-c} = sum_{c' != c} S_{c',z},
   N_z^{-c} likewise; p^_z^{-c} = (S_z^{-c} + alpha/2) / (N_z^{-c} + alpha);
   p^_{c,z} = (S_{c,z} + lam p^_z^{-c}) / (N_{c,z} + lam).
3. Boundary value B = max(0, 1 - 2 |p^_{c,z} - 1/2|); UCB bonus
   U = sqrt(log(N + 1) / (N_{c,z} + 1)); A = max(A_min, B + beta U).
4. p_t(z | c) = (1 - eps) A^{1/gamma} / sum_z' A^{1/gamma} + eps / |Z|.

Choices where the paper is silent (documented and tested):
- S and N count *groups*: a group adds its pass rate p_m to S and 1 to N, so N_{c,z} is
  the number of visits, as the UCB term expects; with K = 1 this is the plain count of
  passes. The bonus's N (no subscript in the paper) is the total number of groups the
  controller has seen over all intents and states.
- Defaults: eta = 0.5 is the paper's eta = 50 on its 0-100 emotion scale mapped to our
  [0, 1] rewards (its sensitivity study uses 40/50/60). The paper gives no values for the
  others; we use alpha = 2 (a Beta(1, 1) pseudo-count around 1/2), lam = 2,
  beta (``c_ucb``) = 0.5, A_min = 0.05, gamma = 1 (no sharpening) and eps = 0.1.

Cost: an update touches O(1) numbers; a distribution reads 24 states of one intent,
i.e. O(24) per update (the "constant-time statistic updates and normalization over 24
state scores" of Sec. 4.4). Plain Python lists: at 24 entries they beat numpy's
per-call overhead (see bench/bench_curriculum.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from counselor_engine.simulation.interaction import ALL_STATES, InteractionState

Z = len(ALL_STATES)


@dataclass(frozen=True)
class CurriculumConfig:
    eta: float = 0.5
    alpha: float = 2.0
    lam: float = 2.0
    c_ucb: float = 0.5
    a_min: float = 0.05
    gamma: float = 1.0
    epsilon: float = 0.1

    def __post_init__(self) -> None:
        checks = {
            "eta": math.isfinite(self.eta),
            "alpha": self.alpha > 0 and math.isfinite(self.alpha),
            "lam": self.lam > 0 and math.isfinite(self.lam),
            "c_ucb": self.c_ucb >= 0 and math.isfinite(self.c_ucb),
            "a_min": self.a_min > 0 and math.isfinite(self.a_min),
            "gamma": self.gamma > 0 and math.isfinite(self.gamma),
            "epsilon": 0.0 <= self.epsilon <= 1.0,
        }
        wrong = [name for name, ok in checks.items() if not ok]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)}: need eta finite, alpha > 0, lam > 0, c_ucb >= 0, "
                "a_min > 0, gamma > 0 and epsilon in [0, 1]"
            )


class CurriculumController:
    """Hierarchical pass-rate controller over (intent, interaction state) units."""

    def __init__(self, intents: Sequence[str], config: CurriculumConfig | None = None) -> None:
        if isinstance(intents, str) or not intents:
            raise ValueError("intents: expected a non-empty sequence of intent keys")
        if any(not isinstance(c, str) or not c for c in intents) or len(set(intents)) != len(
            intents
        ):
            raise ValueError("intents: expected distinct, non-empty strings")
        self.config = config or CurriculumConfig()
        self.intents = tuple(intents)
        self._S = {c: [0.0] * Z for c in self.intents}
        self._N = {c: [0] * Z for c in self.intents}
        self._col_S = [0.0] * Z  # sum over intents, so leave-one-out is a subtraction
        self._col_N = [0] * Z
        self._total = 0

    # -- feedback --------------------------------------------------------------------------
    def update(self, intent: str, state: InteractionState, rewards: Sequence[float]) -> None:
        """Eq. of Sec. 3.4: fold one group's thresholded outcomes into (S, N)."""
        self._check_intent(intent)
        z = _state_index(state)
        if isinstance(rewards, str | bytes) or not isinstance(rewards, Sequence) or not rewards:
            raise ValueError("rewards: expected a non-empty sequence of group rewards")
        eta = self.config.eta
        passed = 0
        for r in rewards:
            if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
                raise ValueError(f"rewards: expected finite numbers, got {r!r}")
            passed += r >= eta
        p_m = passed / len(rewards)
        self._S[intent][z] += p_m
        self._N[intent][z] += 1
        self._col_S[z] += p_m
        self._col_N[z] += 1
        self._total += 1

    # -- allocation ------------------------------------------------------------------------
    def pass_rates(self, intent: str) -> list[float]:
        """p^_{c,z} for the 24 states (Sec. 3.5, leave-one-intent-out pooling)."""
        self._check_intent(intent)
        cfg = self.config
        S, N = self._S[intent], self._N[intent]
        half_alpha = cfg.alpha / 2.0
        out = []
        for z in range(Z):
            pooled = (self._col_S[z] - S[z] + half_alpha) / (self._col_N[z] - N[z] + cfg.alpha)
            out.append((S[z] + cfg.lam * pooled) / (N[z] + cfg.lam))
        return out

    def allocation_scores(self, intent: str) -> list[float]:
        """A_{c,z} = max(A_min, B + beta U) for the 24 states."""
        cfg = self.config
        N = self._N[intent]
        log_total = math.log(self._total + 1)
        scores = []
        for z, p in enumerate(self.pass_rates(intent)):
            boundary = max(0.0, 1.0 - 2.0 * abs(p - 0.5))
            bonus = math.sqrt(log_total / (N[z] + 1))
            scores.append(max(cfg.a_min, boundary + cfg.c_ucb * bonus))
        return scores

    def distribution(self, intent: str) -> np.ndarray:
        """p_t(z | c) over the 24 states, in :data:`ALL_STATES` order; sums to 1."""
        cfg = self.config
        power = 1.0 / cfg.gamma
        weights = [a**power for a in self.allocation_scores(intent)]
        total = sum(weights)
        keep, floor = 1.0 - cfg.epsilon, cfg.epsilon / Z
        return np.array([keep * w / total + floor for w in weights], dtype=np.float64)

    def select(self, intent: str, rng: np.random.Generator) -> InteractionState:
        """Draw z ~ p_t(. | c) with ``rng`` (one uniform draw, inverse CDF)."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng: expected a numpy.random.Generator")
        probs = self.distribution(intent)
        u = rng.random() * float(probs.sum())
        index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return ALL_STATES[min(index, Z - 1)]

    # -- reporting -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-ready counts, pass rates and allocation per intent (for reports)."""
        return {
            "format": 1,
            "config": asdict(self.config),
            "states": [s.key for s in ALL_STATES],
            "total_groups": self._total,
            "intents": {
                c: {
                    "groups": list(self._N[c]),
                    "passes": [round(s, 6) for s in self._S[c]],
                    "pass_rate": [round(p, 6) for p in self.pass_rates(c)],
                    "allocation": [round(float(p), 6) for p in self.distribution(c)],
                }
                for c in self.intents
            },
        }

    def _check_intent(self, intent: str) -> None:
        if intent not in self._S:
            raise ValueError(f"intent: unknown intent {intent!r}; known: {list(self.intents)}")


def _state_index(state: InteractionState) -> int:
    if not isinstance(state, InteractionState):
        raise ValueError(f"state: expected an InteractionState, got {type(state).__name__}")
    return state.index
