"""Client memory in PostgreSQL, and the engine's per-session view of it.

A correction never edits text: it adds a new item that supersedes the old one and keeps
the old item's source (paper App. H.7), so the history of what was remembered survives.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from counselor_engine import memory as engine_memory
from webapp.accounts.models import ClientProfile, ConsentPurpose, User
from webapp.counseling.models import Session
from webapp.lib import audit
from webapp.memory.models import MemoryItem

log = logging.getLogger(__name__)
security_log = logging.getLogger("psyevo.security")


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
    """Replace an active item of ``client`` by a corrected one (same kind and source).

    A correction goes into every later prompt just like a recap, so it passes the same
    instruction filter (policy rule 4 below); where a recap loses the sentence, a
    correction is refused with a message, so the person who typed it knows it was not
    stored and can say it as a plain fact."""
    text = _clean(text)
    if _has_instruction(text):
        security_log.warning(
            "memory policy: instruction-like correction of memory %s by user %s refused",
            item_id, by.pk,
        )  # fmt: skip
        raise MemoryError(
            "This correction reads as an instruction to the AI counselor, so it was not "
            "saved. Please write it as a plain fact about the client."
        )
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


# -- the server-side write policy -----------------------------------------------------------
#
# Memory text goes into every later prompt of its client, so what may be stored is decided
# here, on the server, whatever the model or the client wrote:
#
# 1. Source: counselor memories come only from the session-end recap of the client's OWN
#    session (``save_recap``: the item's client is the session's client, its source turn a
#    turn of that session); other writes are corrections by the client or their clinician
#    (``correct``, which refuses text that rule 4 would change). Nothing else writes
#    MemoryItem rows.
# 2. Size: at most ``MAX_RECAP_ITEMS`` items per recap, each at most ``MAX_MEMORY_CHARS``.
# 3. Kinds: recap, goal, fact, homework only.
# 4. No instructions: a sentence that reads as an instruction to the AI (override, role or
#    template markers, requests to reveal or store other people's data) is never stored
#    verbatim; it is dropped, the rest of the item is kept, and the drop is logged.
#
# ``policy_violations`` checks stored rows against 1-4 (tests and audits use it).

MAX_RECAP_ITEMS = 8
MAX_MEMORY_CHARS = 2000
_INSTRUCTION = re.compile(
    # override: "ignore all previous instructions", "disregard your rules"
    r"\b(?:ignore|disregard|forget|override|bypass)\b(?: (?:all|any|your|previous|prior|"
    r"above|earlier|these|the (?:previous|above|system|data)))+ (?:instructions?|rules?|"
    r"prompt|polic(?:y|ies)|markers?|guidelines)\b"
    r"|\bforget you are\b|\bsystem\s*prompt\b|\b(?:system|developer|admin)\s*(?:override|"
    r"mode|message)\b|\bmaintenance mode\b|\byou are now\b|\bnew (?:rule|instructions?)\b"
    r"|\bunrestricted\b|\bjailbreak|\bact as (?:a|an) (?:database|admin|system|unrestricted)"
    # chat-template and role markers
    r"|<\|[^|>]{0,40}\|>|\[/?(?:inst|sys)\]|<</?sys>>|</?s>|</?client_memory>"
    r"|^\s*(?:system|assistant|developer)\s*:"
    # standing orders and claimed authority meant for later sessions
    r"|\b(?:from now on|every future session|next (?:time|session)|before answering|always start)"
    r"\b.{0,80}\b(?:reveal|print|list|listing|share|show|obey|act|disregard|memor)"
    r"|\b(?:i am|i'm) (?:an? )?(?:administrator|admin|developer|clinician)\b.{0,40}\b(?:may|can|"
    r"allowed|see)\b|\bmust (?:obey|comply)\b|\b(?:authori[sz]ed|agreed) (?:you )?to share\b"
    # requests to reveal stored data in bulk
    r"|\b(?:reveal|print|dump|list|show|share|paste|quote|output|repeat)\b.{0,60}"
    r"\b(?:memor(?:y|ies)|transcripts?|notes|recaps?|homework|system prompt|other (?:clients?|"
    r"patients?|people)|every (?:client|memory)|all (?:client|memor))",
    re.IGNORECASE | re.MULTILINE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def looks_like_instruction(text: str) -> bool:
    """Whether ``text`` reads as an instruction to the AI (policy rule 4)."""
    return bool(_INSTRUCTION.search(text))


def _has_instruction(text: str) -> bool:
    """Whether :func:`_without_instructions` would drop a sentence of ``text``."""
    return any(s.strip() and looks_like_instruction(s) for s in _SENTENCE_END.split(text))


def _without_instructions(text: str) -> str:
    kept = [s for s in _SENTENCE_END.split(text) if s.strip() and not looks_like_instruction(s)]
    return " ".join(s.strip() for s in kept)[:MAX_MEMORY_CHARS]


def save_recap(session: Session, items: Sequence[engine_memory.MemoryItem]) -> list[MemoryItem]:
    """Store what the engine wrote at session end (origin: counselor), under the policy;
    nothing at all while the client's memory consent is withdrawn."""
    if not memory_consented(session.client):
        log.info("session %s: no memory consent, recap not stored", session.pk)
        return []
    stored: list[MemoryItem] = []
    for item in items:
        if len(stored) >= MAX_RECAP_ITEMS:
            log.warning("session %s: recap items past %s dropped", session.pk, MAX_RECAP_ITEMS)
            break
        text = _without_instructions(item.text)
        if text != item.text.strip()[:MAX_MEMORY_CHARS]:
            security_log.warning(
                "memory policy: instruction-like text dropped from a recap of session %s",
                session.pk,
            )
        if not text or item.kind not in MemoryItem.Kind.values:
            continue
        if item.source_turn is not None and not session.turns.filter(seq=item.source_turn).exists():
            continue  # a source outside this session: not the client's own words
        stored.append(
            MemoryItem.objects.create(
                client=session.client,
                kind=item.kind,
                text=text,
                origin=MemoryItem.Origin.COUNSELOR,
                source_session=session,
                source_turn=item.source_turn,
            )
        )
    return stored


def policy_violations(client: User) -> list[tuple[int, str]]:
    """(item id, rule broken) for every stored memory of ``client`` against the policy."""
    out: list[tuple[int, str]] = []
    for item in MemoryItem.objects.filter(client=client).select_related("source_session"):
        if item.origin == MemoryItem.Origin.COUNSELOR and (
            item.source_session is None or item.source_session.client_id != client.pk
        ):
            out.append((item.pk, "source: not a recap of the client's own session"))
        if len(item.text) > MAX_MEMORY_CHARS:
            out.append((item.pk, "size"))
        if item.kind not in MemoryItem.Kind.values:
            out.append((item.pk, "kind"))
        if looks_like_instruction(item.text):
            out.append((item.pk, "instruction-like text stored"))
    per_session: dict[int | None, int] = {}
    for item in MemoryItem.objects.filter(client=client, origin=MemoryItem.Origin.COUNSELOR):
        per_session[item.source_session_id] = per_session.get(item.source_session_id, 0) + 1
    out += [(0, f"session {k}: {n} recap items") for k, n in per_session.items()
            if n > MAX_RECAP_ITEMS]  # fmt: skip
    return out


def memory_consented(client: User) -> bool:
    """The client's memory consent now (the latest record decides; none means no)."""
    profile = ClientProfile.objects.filter(user=client).first()
    return profile is not None and profile.has_consent(ConsentPurpose.MEMORY)


def load_store(client: User) -> engine_memory.MemoryStore:
    """The engine's view: active items only, ids are the database ids. Empty while the
    client's memory consent is withdrawn: the items are kept (the client can still read,
    correct or export them) but no prompt sees them until the consent is given again."""
    if not memory_consented(client):
        return engine_memory.MemoryStore.from_dict(
            {"version": engine_memory.FORMAT_VERSION, "items": []}
        )
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
