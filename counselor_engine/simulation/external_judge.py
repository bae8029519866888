"""External tripartite judge for the simulation lab: reporting only.

After Psi-Arena (three perspectives, their scales and pass thresholds) and PsyEvo App. G
(external scores are reported, never learned from). A finished transcript is scored from:

- the client's perspective: 16 items on 0-4 (maximum 64), passed when total > 42;
- the supervisor's perspective: 8 items on 0-4 (maximum 32), passed when total > 24;
- the counselor's perspective: 9 items on 0-5 (maximum 45), passed when total > 35;

plus the modality-specific items behind PsyEvo's four metric families (C-Shared, C-Spec,
L-Shared, L-Spec; each on 0-10, Overall their unweighted mean):

- L-Shared: the client-perspective items; L-Spec: the client-specific items of the
  profile's modality (e.g. CBT: can question the troubling thought).
- C-Shared: the supervisor- and counselor-perspective items together; C-Spec: the
  counselor-specific items of the modality, judged by the supervisor (a CTRS-like item
  set for CBT, MITI-like for BT, and so on).

Every item score is the expectation of the judge's next-token distribution over the scale's
digits, read through :meth:`Backend.choice_probabilities` exactly as the internal judge
reads its ratings: no free text is ever parsed. All items of one digit range go to the
backend in one batched call (two calls per session: 0-4 and 0-5). The judge runs on the
base model of whatever backend it is given (``adapter`` selects another), which may differ
from the internal judge's.

N/A rule (Psi-Arena leaves it open; the supervisor prompt allows "N/A", the others do not):
1. An item is N/A when its applicability condition does not hold for the transcript:
   ``risk`` items need a client message that the safety module rates concern or crisis;
   ``multi_turn`` items need at least 3 counselor replies. N/A is decided from the
   transcript, never by the model, and an N/A item costs no model call.
2. N/A items are left out of both the total and the maximum, and the pass threshold is
   scaled with the maximum: pass iff total > threshold * applicable_max / nominal_max.
   (Counting N/A as 0 would make the supervisor's > 24/32 unreachable with two N/A items.)
3. A perspective with fewer than half its items applicable cannot pass.
Metric families likewise average applicable items only. N/A items are reported as None.

A non-finite probability raises ValueError: a report is either complete or absent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from counselor_engine import safety
from counselor_engine.backends.base import Backend, ChatMessage
from counselor_engine.simulation.profiles import SimProfile

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
PERSPECTIVES = ("client", "supervisor", "counselor")
FAMILIES = ("c_shared", "c_spec", "l_shared", "l_spec")
MULTI_TURN_MIN = 3


@dataclass(frozen=True)
class Item:
    id: str
    question: str
    applies: str  # "always" | "risk" | "multi_turn"


@dataclass(frozen=True)
class Scale:
    perspective: str
    scale_max: int
    threshold: float
    items: tuple[Item, ...]

    @property
    def maximum(self) -> float:
        return float(self.scale_max * len(self.items))


@dataclass(frozen=True)
class ItemSet:
    scales: dict[str, Scale]
    client_specific: dict[str, tuple[Item, ...]]
    counselor_specific: dict[str, tuple[Item, ...]]


@cache
def default_items() -> ItemSet:
    data = json.loads((PROMPTS / "sim_external_items.json").read_text(encoding="utf-8"))

    def items(raw: Sequence[Mapping[str, str]]) -> tuple[Item, ...]:
        return tuple(Item(i["id"], i["question"], i.get("applies", "always")) for i in raw)

    scales = {
        name: Scale(name, int(s["scale_max"]), float(s["threshold"]), items(s["items"]))
        for name, s in data["perspectives"].items()
    }
    return ItemSet(
        scales,
        {m: items(v) for m, v in data["client_specific"].items()},
        {m: items(v) for m, v in data["counselor_specific"].items()},
    )


@dataclass(frozen=True)
class PerspectiveScore:
    perspective: str
    total: float
    maximum: float  # the applicable maximum (N/A items left out)
    threshold: float  # the scaled threshold compared with total
    passed: bool
    items: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "perspective": self.perspective, "total": self.total, "maximum": self.maximum,
            "threshold": self.threshold, "passed": self.passed, "items": dict(self.items),
        }  # fmt: skip


@dataclass(frozen=True)
class ExternalReport:
    scores: tuple[PerspectiveScore, ...]
    metrics: dict[str, float]  # c_shared, c_spec, l_shared, l_spec, overall (0-10); pass_* (0/1)

    def to_dict(self) -> dict[str, Any]:
        return {"scores": [s.to_dict() for s in self.scores], "metrics": dict(self.metrics)}

    def score(self, perspective: str) -> PerspectiveScore:
        for s in self.scores:
            if s.perspective == perspective:
                return s
        raise KeyError(perspective)


def perspective_score(scale: Scale, values: Mapping[str, float | None]) -> PerspectiveScore:
    """Apply the N/A rule (module docstring) to one perspective's item values."""
    applicable = [values[i.id] for i in scale.items if values.get(i.id) is not None]
    total = float(sum(v for v in applicable if v is not None))
    maximum = float(scale.scale_max * len(applicable))
    threshold = scale.threshold * maximum / scale.maximum
    enough = 2 * len(applicable) >= len(scale.items)
    passed = enough and total > threshold
    items = {i.id: values.get(i.id) for i in scale.items}
    return PerspectiveScore(scale.perspective, total, maximum, threshold, passed, items)


def applicable(item: Item, transcript: Sequence[tuple[str, str]]) -> bool:
    """Rule 1 of the N/A rule, decided from the transcript alone."""
    if item.applies == "always":
        return True
    if item.applies == "multi_turn":
        return sum(1 for role, _ in transcript if role == "counselor") >= MULTI_TURN_MIN
    if item.applies == "risk":
        return any(
            safety.assess(text).level != "none" for role, text in transcript if role == "client"
        )
    raise ValueError(f"item {item.id}: unknown applicability {item.applies!r}")


class ExternalJudge:
    """Scores frozen transcripts; its output is for reports only (App. G)."""

    def __init__(
        self,
        backend: Backend,
        *,
        adapter: str | None = None,
        items: ItemSet | None = None,
        transcript_chars: int = 4000,
    ) -> None:
        self.backend = backend
        self.adapter = adapter
        self.items = items or default_items()
        self.transcript_chars = transcript_chars

    def _case(self, profile: SimProfile) -> str:
        formulation = "; ".join(
            f"{k.replace('_', ' ')}: {v}" for k, v in profile.formulation.items()
        )
        return (
            f"<case>\nClient: {profile.name}. {profile.persona}\nPresenting problem: "
            f"{profile.presenting_problem}\nHistory: {profile.history}\nUnderlying need: "
            f"{profile.hidden_need}\nFormulation ({profile.modality}): {formulation}\n</case>"
        )

    def _conversation(self, transcript: Sequence[tuple[str, str]]) -> str:
        text = "\n".join(
            f"{'Client' if r == 'client' else 'Counselor'}: {t}" for r, t in transcript
        )
        if len(text) > self.transcript_chars:
            text = "…" + text[-self.transcript_chars :]
        return f"<conversation>\n{text}\n</conversation>"

    async def evaluate(
        self, profile: SimProfile, transcript: Sequence[tuple[str, str]]
    ) -> ExternalReport:
        if not isinstance(profile, SimProfile):
            raise ValueError("profile: expected a SimProfile")
        turns = [(r, t) for r, t in transcript]
        if any(r not in ("client", "counselor") or not isinstance(t, str) for r, t in turns):
            raise ValueError("transcript: roles must be 'client' or 'counselor' with text")
        if not any(r == "counselor" for r, _ in turns):
            raise ValueError("transcript: no counselor reply to evaluate")
        sets = self.items
        lspec = sets.client_specific.get(profile.modality, ())
        cspec = sets.counselor_specific.get(profile.modality, ())
        # (perspective whose prompt is used, item) for every applicable item.
        asks: list[tuple[str, Item]] = []
        for name in PERSPECTIVES:
            asks += [(name, i) for i in sets.scales[name].items if applicable(i, turns)]
        asks += [("client", i) for i in lspec if applicable(i, turns)]
        asks += [("supervisor", i) for i in cspec if applicable(i, turns)]
        values = await self._ask(profile, turns, asks)

        scores = tuple(perspective_score(sets.scales[n], values) for n in PERSPECTIVES)
        by_name = {s.perspective: s for s in scores}
        supervisor, counselor = by_name["supervisor"], by_name["counselor"]
        metrics = {
            "c_shared": _ratio(
                supervisor.total + counselor.total, supervisor.maximum + counselor.maximum
            ),
            "c_spec": _mean_ratio(values, cspec, sets.scales["supervisor"].scale_max),
            "l_shared": _ratio(by_name["client"].total, by_name["client"].maximum),
            "l_spec": _mean_ratio(values, lspec, sets.scales["client"].scale_max),
        }
        known = [v for v in metrics.values() if not math.isnan(v)]
        metrics["overall"] = sum(known) / len(known) if known else math.nan
        for s in scores:
            metrics[f"pass_{s.perspective}"] = 1.0 if s.passed else 0.0
        metrics["pass_all"] = 1.0 if all(s.passed for s in scores) else 0.0
        return ExternalReport(scores, metrics)

    async def _ask(
        self, profile: SimProfile, turns: list[tuple[str, str]], asks: list[tuple[str, Item]]
    ) -> dict[str, float | None]:
        case, convo = self._case(profile), self._conversation(turns)
        values: dict[str, float | None] = {}
        by_range: dict[int, list[tuple[str, Item]]] = {}
        for name, item in asks:
            by_range.setdefault(self.items.scales[name].scale_max, []).append((name, item))
        for top, group in sorted(by_range.items()):
            digits = tuple(str(d) for d in range(top + 1))
            prompts = [
                [
                    ChatMessage("system", _system(name)),
                    ChatMessage(
                        "user",
                        f"{case}\n{convo}\n\nStatement: {item.question}\n"
                        f"Answer with one digit from 0 to {top}.",
                    ),
                ]
                for name, item in group
            ]
            rows = await self.backend.choice_probabilities(prompts, digits, adapter=self.adapter)
            for (_, item), row in zip(group, rows, strict=True):
                values[item.id] = _expected(item.id, row)
        return values


@cache
def _system(perspective: str) -> str:
    return (PROMPTS / f"sim_judge_{perspective}.txt").read_text(encoding="utf-8").strip()


def _expected(item_id: str, row: Sequence[float]) -> float:
    total = sum(row)
    if not math.isfinite(total) or total <= 0 or not all(math.isfinite(p) for p in row):
        raise ValueError(f"external judge: non-finite probabilities for item {item_id}")
    return sum(d * p for d, p in enumerate(row)) / total


def _ratio(total: float, maximum: float) -> float:
    return 10.0 * total / maximum if maximum > 0 else math.nan


def _mean_ratio(values: Mapping[str, float | None], items: Sequence[Item], top: int) -> float:
    scored = [v for v in (values.get(i.id) for i in items) if v is not None]
    return 10.0 * sum(scored) / (top * len(scored)) if scored else math.nan
