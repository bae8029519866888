"""The paper's Table 3 ablations as switches (PsyEvo, Sec. 3.4 and App. C Table 9).

- ``no_hbsp``: the shared skill table stays; client-private residuals and their updates go
  (``CounselorConfig.use_hbsp = False``; ``hbsp.shared_only_decision``).
- ``no_soca``: raw single-order scores (the forward presentation order only, no two-order
  check or average) replace the consistency-checked acyclic graph, and the trajectory
  credit uses unprojected outcomes (``CounselorConfig.use_soca = False``;
  ``soca.raw_preference_edges``, ``soca.raw_delivered``, ``soca.unprojected_returns``).
- ``no_lipo``: the adapter stays fixed (applied by the training side).
- ``pairwise_dpo``: unit-weight pairwise DPO over every SOCA edge, averaged over all pairs
  with no per-group normalisation, replaces the weighted group objective (applied by the
  training side: ``counselor_engine.lipo.loss.pairwise_dpo_loss``).

Each variant removes one component and keeps every other learning path. The variants'
maths sits beside the equation it replaces (hbsp.py, soca.py), not here: the counselor
calls it, and this package imports the counselor.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from counselor_engine.counselor import CounselorConfig

NAMES = ("no_hbsp", "no_lipo", "pairwise_dpo", "no_soca")


@dataclass(frozen=True)
class Ablation:
    no_hbsp: bool = False
    no_lipo: bool = False
    pairwise_dpo: bool = False
    no_soca: bool = False

    def __post_init__(self) -> None:
        if self.no_lipo and self.pairwise_dpo:
            raise ValueError("no_lipo and pairwise_dpo exclude each other: no_lipo trains nothing")

    @classmethod
    def parse(cls, text: str) -> Ablation:
        """``"none"`` or a comma list of no_hbsp, no_lipo, pairwise_dpo, no_soca."""
        if not isinstance(text, str):
            raise ValueError("ablation: expected text such as 'none' or 'no_hbsp,no_soca'")
        words = [w.strip().lower().replace("-", "_") for w in text.split(",") if w.strip()]
        if not words:
            raise ValueError("ablation: empty; use 'none' for the full system")
        if words == ["none"]:
            return cls()
        unknown = [w for w in words if w not in NAMES]
        if unknown:
            raise ValueError(f"ablation: unknown {unknown}; expected 'none' or some of {NAMES}")
        return cls(**{w: True for w in words})

    @property
    def label(self) -> str:
        on = [f.name for f in fields(self) if getattr(self, f.name)]
        return ",".join(on) if on else "none"

    def apply(self, config: CounselorConfig) -> CounselorConfig:
        """The counselor config with the engine-side switches set (no_hbsp, no_soca)."""
        return replace(config, use_hbsp=not self.no_hbsp, use_soca=not self.no_soca)
