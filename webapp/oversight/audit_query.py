"""Reading the audit log (the write side is ``webapp.lib.audit``): filters shared by the
admin page and its CSV export."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from datetime import datetime, time
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from webapp.oversight.models import AuditEvent

CSV_COLUMNS = ("id", "created_at", "action", "actor", "actor_role", "subject", "target", "detail")


def filtered(data: dict[str, Any]) -> QuerySet[AuditEvent]:
    """Events matching the cleaned AuditFilterForm data, newest first."""
    events = AuditEvent.objects.select_related("actor", "subject").order_by("-created_at", "-id")
    if data.get("action"):
        events = events.filter(action__startswith=data["action"])
    if data.get("actor"):
        events = events.filter(actor__username=data["actor"])
    if data.get("subject"):
        value = str(data["subject"])
        match = Q(subject__username=value)
        if value.isdigit():
            # An erased client's events keep their id; the tombstone names it in target.
            match |= Q(subject_id=int(value)) | Q(target=f"user:{value}")
        events = events.filter(match)
    if data.get("since"):
        events = events.filter(created_at__gte=_day(data["since"], time.min))
    if data.get("until"):
        events = events.filter(created_at__lte=_day(data["until"], time.max))
    return events


def _day(day: Any, at: time) -> datetime:
    return timezone.make_aware(datetime.combine(day, at))


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_rows(events: Iterable[AuditEvent]) -> Iterator[str]:
    """CSV lines, streamed. Cells that a spreadsheet would run as a formula are quoted
    with a leading apostrophe (CSV injection)."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for e in events:
        yield writer.writerow(
            [
                _cell(v)
                for v in (
                    e.pk,
                    e.created_at.isoformat(),
                    e.action,
                    e.actor.username if e.actor else "",
                    e.actor.role if e.actor else "system",
                    e.subject.username if e.subject else "",
                    e.target,
                    json.dumps(e.detail, sort_keys=True),
                )
            ]
        )


def _cell(value: object) -> str:
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
