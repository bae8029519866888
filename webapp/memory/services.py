"""Client memory in PostgreSQL, and the engine's per-session view of it.

A correction never edits text: it adds a new item that supersedes the old one and keeps
the old item's source (paper App. H.7), so the history of what was remembered survives.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from counselor_engine import memory as engine_memory
from webapp.accounts.models import User
from webapp.counseling.models import Session
from webapp.memory.models import MemoryItem
from webapp.oversight import audit


class MemoryError(ValueError):
    """A memory change that cannot be made; the message says why."""


def active_items(client: User) -> QuerySet[MemoryItem]:
    return (
        MemoryItem.objects.filter(
            client=client, retired_at__isnull=True, superseded_by__isnull=True
        )
        .select_related("source_session")
        .order_by("created_at", "id")
    )


def _clean(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise MemoryError("The corrected text must not be empty.")
    if len(text) > 2000:
        raise MemoryError("Keep a memory under 2000 characters.")
    return text.strip()


@transaction.atomic
def correct(item_id: int, text: str, *, by: User, client: User) -> MemoryItem:
    """Replace an active item of ``client`` by a corrected one (same kind and source)."""
    text = _clean(text)
    item = MemoryItem.objects.select_for_update().filter(pk=item_id, client=client).first()
    if item is None:
        raise MemoryError("No such memory.")
    if item.retired_at is not None or MemoryItem.objects.filter(supersedes=item).exists():
        raise MemoryError("This memory was already corrected or removed; reload the page.")
    origin = MemoryItem.Origin.CLIENT if by.pk == client.pk else MemoryItem.Origin.CLINICIAN
    new = MemoryItem.objects.create(
        client=client,
        kind=item.kind,
        text=text,
        origin=origin,
        source_session=item.source_session,
        source_turn=item.source_turn,
        supersedes=item,
        created_by=by,
    )
    audit.record(by, "memory.correct", subject=client, target=f"memory:{item.pk}", new_item=new.pk)
    return new


@transaction.atomic
def retire(item_id: int, *, by: User, client: User) -> None:
    item = MemoryItem.objects.select_for_update().filter(pk=item_id, client=client).first()
    if item is None:
        raise MemoryError("No such memory.")
    if item.retired_at is None:
        item.retired_at = timezone.now()
        item.retired_by = by
        item.save(update_fields=["retired_at", "retired_by"])
        audit.record(by, "memory.retire", subject=client, target=f"memory:{item.pk}")


def save_recap(session: Session, items: Sequence[engine_memory.MemoryItem]) -> list[MemoryItem]:
    """Store what the engine wrote at session end (origin: counselor)."""
    return [
        MemoryItem.objects.create(
            client=session.client,
            kind=item.kind,
            text=item.text,
            origin=MemoryItem.Origin.COUNSELOR,
            source_session=session,
            source_turn=item.source_turn,
        )
        for item in items
        if item.text.strip()
    ]


def load_store(client: User) -> engine_memory.MemoryStore:
    """The engine's view: active items only, ids are the database ids."""
    return engine_memory.MemoryStore.from_dict(
        {
            "version": engine_memory.FORMAT_VERSION,
            "items": [
                {
                    "id": str(item.pk),
                    "kind": item.kind,
                    "text": item.text,
                    "source_session": str(item.source_session_id)
                    if item.source_session_id
                    else None,
                    "source_turn": item.source_turn,
                    "origin": item.origin,
                    "created_at": item.created_at.isoformat(),
                }
                for item in active_items(client)
            ],
        }
    )
