"""Learning-loop health: is the evidence buffer filling, and is the loop turning?

A loop that never turns looks, from the outside, exactly like one that does: clients are
answered either way. What tells them apart is the evidence (issue 20: with a judge that
says "A" whatever A is, every graph was empty and no round ever had a batch). Figures,
per day and per generating adapter version, from the stored candidate groups:

- judged turns: candidate groups with at least one pairwise judgment;
- empty-graph share: judged groups whose SOCA graph has no edge (delivery then falls back
  to pointwise and the group teaches LiPO nothing);
- order-consistency rate: of all judged pairs, the share whose two orders agree strictly
  on the same side of 0.5 (Eq. 7's first test, before the floor);
- edges added: edges admitted into the graphs.

And now: the available buffer per modality (groups, edges), the time since the last
admissible batch (the start of the latest round that claimed one), the number of judged
turns since the last one that added an edge, and ``stalled`` when that number reaches
``PSYEVO_LOOP_STALL_TURNS`` (the console's warning).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from webapp.learning.models import CandidateGroup, TrainingRun


@dataclass
class HealthRow:
    day: dt.date
    version: str  # the generating adapter version, "base" for the base model
    judged_turns: int = 0
    empty_graphs: int = 0
    pairs: int = 0
    consistent_pairs: int = 0
    edges: int = 0

    @property
    def empty_graph_share(self) -> float:
        return self.empty_graphs / self.judged_turns if self.judged_turns else 0.0

    @property
    def order_consistency(self) -> float:
        return self.consistent_pairs / self.pairs if self.pairs else 0.0


@dataclass
class LoopHealth:
    rows: list[HealthRow]
    buffer: dict[str, tuple[int, int]]  # modality -> (available groups, their edges)
    last_batch_at: dt.datetime | None
    turns_since_edge: int
    stall_turns: int
    now: dt.datetime = field(default_factory=timezone.now)

    @property
    def since_last_batch(self) -> dt.timedelta | None:
        return None if self.last_batch_at is None else self.now - self.last_batch_at

    @property
    def since_last_batch_text(self) -> str:
        return describe(self.since_last_batch)

    @property
    def stalled(self) -> bool:
        return self.turns_since_edge >= self.stall_turns


def pair_counts(support: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(judged pairs, pairs whose two orders agree strictly on one side of 0.5)."""
    pairs = consistent = 0
    for row in support:
        f, b = float(row["forward"]), float(row["backward"])
        pairs += 1
        consistent += (f > 0.5 and b > 0.5) or (f < 0.5 and b < 0.5)
    return pairs, consistent


def loop_health(*, days: int = 14, stall_turns: int | None = None) -> LoopHealth:
    """The figures above over the last ``days`` days (stall count over all time)."""
    stall = settings.PSYEVO_LOOP_STALL_TURNS if stall_turns is None else stall_turns
    since = timezone.now() - dt.timedelta(days=days)
    rows: dict[tuple[dt.date, str], HealthRow] = {}
    judged = CandidateGroup.objects.exclude(support=[]).exclude(support={})
    groups = (
        judged.filter(created_at__gte=since)
        .values_list("created_at", "adapter_version__name", "support", "edge_count")
        .order_by("created_at")
    )
    for created, version, support, edges in groups:
        day = timezone.localtime(created).date()
        row = rows.setdefault((day, version or "base"), HealthRow(day, version or "base"))
        pairs, consistent = pair_counts(support)
        row.judged_turns += 1
        row.empty_graphs += edges == 0
        row.pairs += pairs
        row.consistent_pairs += consistent
        row.edges += edges
    last_edge = judged.filter(edge_count__gt=0).order_by("-created_at").first()
    after = judged if last_edge is None else judged.filter(created_at__gt=last_edge.created_at)
    buffer = {
        r["modality"]: (r["groups"], r["edges"] or 0)
        for r in CandidateGroup.objects.filter(buffer_status=CandidateGroup.Buffer.AVAILABLE)
        .values("modality")
        .annotate(groups=Count("pk"), edges=Sum("edge_count"))
        .order_by("modality")
    }
    batch = (
        TrainingRun.objects.filter(group_count__gt=0, started_at__isnull=False)
        .order_by("-started_at")
        .first()
    )
    return LoopHealth(
        rows=sorted(rows.values(), key=lambda r: (r.day, r.version), reverse=True),
        buffer=buffer,
        last_batch_at=batch.started_at if batch else None,
        turns_since_edge=after.count(),
        stall_turns=stall,
    )


def describe(delta: dt.timedelta | None) -> str:
    """'3 h 20 min', '2 d 4 h', or 'never'."""
    if delta is None:
        return "never"
    minutes = int(delta.total_seconds() // 60)
    d, rest = divmod(minutes, 24 * 60)
    h, m = divmod(rest, 60)
    return f"{d} d {h} h" if d else f"{h} h {m} min"
