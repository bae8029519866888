"""What of a validation report the approval page may show (issue 18).

The approval page is open to every clinician and admin, so a side-by-side entry may carry
client text only when no client wrote it: project-written states (``source: project``,
``training_worker/validation.py``) or the simulation lab's synthetic clients
(``source: simulated``). Any other entry, such as one a round before issue 18 copied from
a held-out evidence group, is shown as withheld, with its modality only; migration
``learning.0009`` rewrites the stored reports the same way.
"""

from __future__ import annotations

from typing import Any

SHOWABLE_SOURCES = frozenset({"project", "simulated"})


def withheld(entry: object) -> dict[str, Any]:
    modality = entry.get("modality") if isinstance(entry, dict) else None
    return {"modality": modality if isinstance(modality, str) else "", "withheld": True}


def showable_side_by_side(report: object) -> list[dict[str, Any]]:
    """The report's side-by-side entries, each either showable as is or withheld."""
    entries = report.get("side_by_side") if isinstance(report, dict) else None
    if not isinstance(entries, list):
        return []
    return [
        entry
        if isinstance(entry, dict) and entry.get("source") in SHOWABLE_SOURCES
        else withheld(entry)
        for entry in entries
    ]
