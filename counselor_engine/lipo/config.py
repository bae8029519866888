"""Every LiPO setting in one typed dataclass, its defaults written once (as TRL's DPOConfig).

Who builds it: ``webapp/settings.py`` builds ``settings.LIPO`` from the ``LIPO_*``
environment variables, taking each default from here (``LipoConfig.steps`` and so on),
and everything else reads that one object: the scheduler and sampler on the web side, the
round, trainer, validation and arena in ``training_worker``. Settings builds it rather
than a function at each point of use because a bad value must stop the process at
startup (settings fail loudly), not a round hours later; tests and the bench change it
with ``dataclasses.replace(settings.LIPO, ...)``, which validates again.

No Django and no torch here: the web side imports this module.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from counselor_engine.skills import MODALITIES

LOSSES = ("lipo", "pairwise_dpo")
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class LipoConfig:
    """The fields set from the environment (``LIPO_<FIELD>``) come first, then those only
    code sets (tests, the bench, a simulation run's ablation)."""

    # Scheduling and the batch (web side; paper App. C "Population weighting").
    sessions_per_round: int = 5  # completed sessions that make a round eligible
    batch_edges: int = 320  # preference edges per round, exactly
    min_groups: int = 32
    modalities: tuple[str, ...] = MODALITIES
    min_share: float = 0.2  # each modality's least share of the edges
    # Optimisation (training_worker.trainer).
    lora_rank: int = 8
    learning_rate: float = 1e-5
    steps: int = 3
    beta: float = 0.1
    max_length: int = 512  # tokens of prompt + reply
    # The evidence lease and poison-run limit (training_worker.round).
    lease_minutes: int = 120
    max_attempts: int = 3
    # Validation before the approval gate (training_worker.validation).
    max_update_ratio: float = 0.05  # ||dW change|| / ||W_base|| over the adapted matrices
    side_by_side: int = 3  # held-out prompts shown to the clinician
    side_by_side_tokens: int = 64  # per side-by-side and arena reply
    arena_clients: int = 2  # simulated clients per version; 0 skips the arena check

    # Not in the environment.
    queue: str = "training"  # the Celery queue of rounds
    loss: str = "lipo"  # or "pairwise_dpo", the Table 3 ablation (LipoTrainer.batch_loss)
    micro_batch_tokens: int = 8192  # padded tokens per forward pass
    target_modules: tuple[str, ...] = TARGET_MODULES
    seed: int = 0
    heldout_groups: int = 16  # groups outside the batch for the held-out accuracy check
    # The output-guard check: the candidate may have at most this many more rejected
    # replies than its parent.
    guard_tolerance: int = 0
    arena_sessions: int = 1
    arena_turns: int = 3  # exchanges per session
    arena_candidates: int = 3  # the counselor's N during the arena
    arena_tolerance: float = 0.5  # points on the 0-10 metric scale

    def __post_init__(self) -> None:
        for name in ("modalities", "target_modules"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name}: expected a sequence of names, got {value!r}")
            object.__setattr__(self, name, tuple(value))  # a list from the env or a test
        unknown = [m for m in self.modalities if m not in MODALITIES]
        if unknown or not self.modalities:  # else the first round fails, hours after start
            raise ValueError(
                f"modalities: expected names from {', '.join(MODALITIES)}, got {self.modalities!r}"
            )
        at_least = {
            "sessions_per_round": 1, "batch_edges": 1, "min_groups": 1, "lora_rank": 1,
            "steps": 1, "max_length": 16, "lease_minutes": 1, "max_attempts": 1,
            "side_by_side": 0, "side_by_side_tokens": 1, "arena_clients": 0,
            "arena_sessions": 1, "arena_turns": 1, "arena_candidates": 1,
        }  # fmt: skip
        for name, minimum in at_least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
        for name in ("min_share", "learning_rate", "beta", "max_update_ratio", "arena_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name}: expected a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {self.loss!r}")
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError(f"queue: expected a queue name, got {self.queue!r}")

    @property
    def lora_alpha(self) -> int:
        return 2 * self.lora_rank

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as a training run records the settings it ran with."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
