"""Template helpers for the consoles: durations, number formats, the dashboard extras."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django import template

from webapp.accounts.models import User
from webapp.oversight import console, training

register = template.Library()


@register.filter
def run_duration(run: Any) -> str:
    took = training.duration(run)
    return _human(took) if took is not None else ""


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@register.filter
def num(value: Any, places: int = 3) -> str:
    """A float with fixed places; blank for None (e.g. a missing turn outcome)."""
    if value is None or value == "":
        return ""
    try:
        return f"{float(value):.{int(places)}f}"
    except (TypeError, ValueError):
        return ""


@register.filter
def percent(value: Any) -> str:
    if value is None:
        return ""
    return f"{100 * float(value):.1f}%"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.simple_tag
def clinician_extras(user: User) -> dict[str, Any]:
    """For the clinician dashboard (rendered by accounts.views.clinician_home): which
    assigned clients' outcome trends are falling, and flags escalated to this clinician."""
    ids = list(user.assigned_clients.values_list("user_id", flat=True))
    return {"falling": console.falling_clients(ids), "escalated": console.escalated_to(user)}


@register.filter
def sd(precision: Any) -> float | None:
    """Standard deviation from a posterior precision."""
    try:
        return float(precision) ** -0.5
    except (TypeError, ValueError, ZeroDivisionError):
        return None


@register.filter
def cap(value: Any, limit: int) -> int:
    try:
        return min(int(value), int(limit))
    except (TypeError, ValueError):
        return 0


@register.filter
def as_json(value: Any) -> str:
    """Compact JSON for an audit event's detail (autoescaped by the template)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
