"""What the client and the model are told: the fixed crisis reply and the concern guidance,
per locale, from ``data/safety/resources.json`` (hotlines are national)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

RESOURCES_PATH = Path(__file__).resolve().parents[1] / "data" / "safety" / "resources.json"
DEFAULT_LOCALE = "en-US"


@cache
def _resources() -> dict[str, dict[str, object]]:
    data = json.loads(RESOURCES_PATH.read_text(encoding="utf-8"))
    return {k.lower(): v for k, v in data.items() if not k.startswith("_")}


def _locale_entry(locale: str) -> dict[str, object]:
    """Exact match on the normalised tag, else the fallback: hotlines are national, so a
    language alone ("en") or an unlisted country never borrows another country's number."""
    key = str(locale or "").strip().replace("_", "-").lower()
    table = _resources()
    return table.get(key) or table["fallback"]


def locales() -> tuple[str, ...]:
    """Locales with their own resources (the fallback excluded)."""
    return tuple(k for k in _resources() if k != "fallback")


def safe_response(locale: str = DEFAULT_LOCALE) -> str:
    """The fixed reply sent instead of a generated one at ``crisis`` level.

    Unknown locales get the generic fallback (contact local emergency services).
    """
    entry = _locale_entry(locale)
    lines = [str(entry["opening"]), ""]
    lines += [f"- {line}" for line in entry["resources"]]  # type: ignore[attr-defined]
    lines += ["", str(entry["closing"])]
    return "\n".join(lines)


_GUIDANCE = (
    "Safety note for this reply: something the client said may mean they, or someone near "
    "them, are at risk of harm. Respond warmly to what they shared, then gently and directly "
    "check on their safety: ask, in plain words, whether they are having thoughts of harming "
    "themselves or anyone else and whether they are safe right now. Do not lecture, do not "
    "diagnose, do not promise to keep secrets, and do not describe any method of harm. If they "
    "are in danger, encourage them to contact a crisis line or emergency services. {short}"
)


def concern_guidance(locale: str = DEFAULT_LOCALE) -> str:
    """System-prompt addition at ``concern`` level: the model replies, but checks safety."""
    return _GUIDANCE.format(short=str(_locale_entry(locale)["short"]))
