"""Erasing a client (right to erasure), with a report and an audit tombstone.

What goes: every course and session with its transcript (turns), skill decisions,
candidate groups (the evidence buffer), posterior cells and their update history, safety
flags and their alert rows, memory items, controls, the client profile and its consent
records. The account row stays as an inactive, de-identified shell (username
``erased-<id>``, no email or names, unusable password) because audit events point at it:
the audit log is append-only in the database (an UPDATE trigger), so the ``SET NULL``
that deleting the user would need on those rows is refused, by design.

Evidence that an approved adapter already trained on cannot be taken back out of the
weights; the report lists it (group, run, version) before the rows are deleted. Copies of
the client's words elsewhere go too: a validation report's side-by-side entry made from
one of the client's groups keeps its place but loses its prompt and replies.

The erasure itself leaves one tombstone audit event: subject NULL, the former user id and
a keyed hash of the former username (HMAC with SECRET_KEY: an admin can check "was this
user erased?" without the log holding the name).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from webapp.accounts.models import ClientProfile, Role, User
from webapp.counseling.models import Course, Session, Turn
from webapp.learning.models import (
    AdapterVersion,
    CandidateGroup,
    PosteriorCell,
    PosteriorUpdate,
    TrainingRun,
)
from webapp.memory.models import MemoryItem
from webapp.oversight import audit
from webapp.oversight.models import AuditEvent, ClientControl, SafetyFlag

APPROVED = (
    AdapterVersion.Status.APPROVED,
    AdapterVersion.Status.ACTIVE,
    AdapterVersion.Status.RETIRED,
)


class ErasureError(ValueError):
    """The erasure cannot run; the message says why."""


@dataclass(frozen=True)
class ErasureReport:
    event: AuditEvent
    counts: dict[str, int]
    used_evidence: list[dict[str, Any]]


def username_hash(username: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), username.encode(), hashlib.sha256).hexdigest()


def used_by_approved_adapters(client: User) -> list[dict[str, Any]]:
    """The client's candidate groups that a run whose version was approved trained on:
    consumed groups leased to that run, or ids in its recorded batch."""
    groups = {
        g.pk: g
        for g in CandidateGroup.objects.filter(client=client).only("pk", "group_key", "lease_run")
    }
    if not groups:
        return []
    # Approved runs are few (one per adapter version): checking each batch here is cheap.
    runs = TrainingRun.objects.filter(output_version__status__in=APPROVED).select_related(
        "output_version"
    )
    used = []
    for run in runs:
        batch = {int(i) for i in run.batch or [] if isinstance(i, int)}
        for pk, group in groups.items():
            if pk in batch or group.lease_run_id == run.pk:
                used.append(
                    {
                        "group": pk,
                        "group_key": group.group_key,
                        "run": run.pk,
                        "version": run.output_version.name if run.output_version else None,
                        "version_status": run.output_version.status if run.output_version else None,
                    }
                )
    return sorted(used, key=lambda u: (u["run"], u["group"]))


ERASED = "[erased]"


def scrub_validation_reports(group_keys: set[str]) -> int:
    """Blank the side-by-side entries (client prompt and the replies to it) that adapter
    validation reports hold for these groups; returns how many entries were blanked."""
    if not group_keys:
        return 0
    scrubbed = 0
    for version in AdapterVersion.objects.select_for_update().exclude(validation_report=None):
        report = version.validation_report or {}
        entries = report.get("side_by_side") if isinstance(report, dict) else None
        if not isinstance(entries, list):
            continue
        hits = [e for e in entries if isinstance(e, dict) and e.get("group") in group_keys]
        for entry in hits:
            entry.update(
                prompt=[{"role": "user", "content": ERASED}],
                parent=ERASED,
                candidate=ERASED,
                erased=True,
            )
        if hits:
            AdapterVersion.objects.filter(pk=version.pk).update(validation_report=report)
            scrubbed += len(hits)
    return scrubbed


def preview(client: User) -> dict[str, int]:
    """What an erasure would delete, counted (for the confirmation page)."""
    return {
        "sessions": Session.objects.filter(client=client).count(),
        "turns": Turn.objects.filter(session__client=client).count(),
        "evidence groups": CandidateGroup.objects.filter(client=client).count(),
        "posterior cells": PosteriorCell.objects.filter(client=client).count(),
        "posterior updates": PosteriorUpdate.objects.filter(cell__client=client).count(),
        "memory items": MemoryItem.objects.filter(client=client).count(),
        "safety flags": SafetyFlag.objects.filter(client=client).count(),
    }


def erase_client(admin: User, client: User) -> ErasureReport:
    """Delete the client's data (module docstring), in one transaction.

    Order matters: sessions go first so that their turns are DELETED with them, before
    anything could touch a turn's ``author`` (turns refuse UPDATE, like the audit log).
    """
    if client.role != Role.CLIENT:
        raise ErasureError("Only client accounts can be erased here.")
    if client.username.startswith("erased-") and not client.is_active:
        raise ErasureError("This client was already erased.")
    with transaction.atomic():
        client = User.objects.select_for_update().get(pk=client.pk)
        counts = preview(client)
        used = used_by_approved_adapters(client)
        former = {"id": client.pk, "username_hmac": username_hash(client.username)}
        keys = set(CandidateGroup.objects.filter(client=client).values_list("group_key", flat=True))
        counts["validation report entries"] = scrub_validation_reports(keys)
        SafetyFlag.objects.filter(client=client).delete()  # and their outbox rows
        CandidateGroup.objects.filter(client=client).delete()
        Session.objects.filter(client=client).delete()  # turns, decisions, updates
        Course.objects.filter(client=client).delete()
        PosteriorCell.objects.filter(client=client).delete()
        # A correction chain is linked with PROTECT: unlink it, then delete every item.
        MemoryItem.objects.filter(client=client).update(supersedes=None)
        MemoryItem.objects.filter(client=client).delete()
        ClientControl.objects.filter(client=client).delete()
        ClientProfile.objects.filter(user=client).delete()  # and the consent records
        client.username = f"erased-{client.pk}"
        client.email = client.first_name = client.last_name = ""
        client.is_active = False
        client.set_unusable_password()
        client.save()
        event = audit.record(
            admin,
            "client.erase",
            subject=None,
            target=f"user:{former['id']}",
            former_user_id=former["id"],
            former_username_hmac=former["username_hmac"],
            deleted=counts,
            evidence_used_by_approved_adapters=used,
        )
    return ErasureReport(event, counts, used)
