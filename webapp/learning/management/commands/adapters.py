"""``manage.py adapters``: list adapter versions and their state (and recent rounds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Q

from webapp.learning import health
from webapp.learning.models import AdapterVersion, TrainingRun


class Command(BaseCommand):
    help = "List adapter versions, their status and lineage."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", action="store_true", help="also list recent rounds")

    def handle(self, *args: Any, **options: Any) -> None:
        versions = (
            AdapterVersion.objects.select_related("parent", "approved_by")
            .annotate(open_sessions=Count("sessions", filter=Q(sessions__status="open")))
            .order_by("created_at", "pk")
        )
        rows = [("ID", "NAME", "STATUS", "PARENT", "CREATED", "APPROVED BY", "SHA256", "OPEN")]
        for v in versions:
            rows.append((
                str(v.pk), v.name, v.status, v.parent.name if v.parent else "-",
                f"{v.created_at:%Y-%m-%d %H:%M}",
                v.approved_by.username if v.approved_by else "-",
                v.sha256[:12] or "-", str(v.open_sessions),
            ))  # fmt: skip
        self._table(rows)
        if not versions:
            self.stdout.write("(no adapter versions: clients are served by the base model)")
        if options["runs"]:
            self.stdout.write("")
            runs = [("RUN", "STATUS", "PHASE", "ATTEMPTS", "GROUPS", "EDGES", "OUTPUT", "ERROR")]
            for r in TrainingRun.objects.select_related("output_version").order_by("-pk")[:20]:
                runs.append((
                    str(r.pk), r.status, r.phase or "-", str(r.attempts), str(r.group_count),
                    str(r.edge_count), r.output_version.name if r.output_version else "-",
                    (r.error or "")[:60],
                ))  # fmt: skip
            self._table(runs)
        self._health()

    def _health(self) -> None:
        """Learning-loop health (webapp/learning/health.py): the loop can stall silently."""
        state = health.loop_health()
        self.stdout.write("")
        self.stdout.write("LEARNING LOOP (last 14 days)")
        rows = [("DAY", "VERSION", "JUDGED", "EMPTY GRAPHS", "ORDER-CONSISTENT", "EDGES")]
        for r in state.rows:
            rows.append((
                f"{r.day:%Y-%m-%d}", r.version, str(r.judged_turns),
                f"{r.empty_graph_share:.0%}", f"{r.order_consistency:.0%}", str(r.edges),
            ))  # fmt: skip
        self._table(rows)
        buffer = ", ".join(f"{m} {g} groups/{e} edges" for m, (g, e) in state.buffer.items())
        self.stdout.write(f"buffer (available): {buffer or 'empty'}")
        self.stdout.write(
            f"since the last admissible batch: {health.describe(state.since_last_batch)}"
        )
        self.stdout.write(f"judged turns since the last edge: {state.turns_since_edge}")
        if state.stalled:
            self.stdout.write(
                self.style.WARNING(
                    f"WARNING: the learning loop has stalled: {state.turns_since_edge} judged "
                    f"turns without a preference edge (threshold {state.stall_turns}, "
                    "PSYEVO_LOOP_STALL_TURNS)"
                )
            )

    def _table(self, rows: Sequence[tuple[str, ...]]) -> None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
