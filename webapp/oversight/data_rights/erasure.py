"""Erasing a client (right to erasure), with a report and an audit tombstone.

What goes: every course and session with its transcript (turns), skill decisions,
candidate groups (the evidence buffer), posterior cells and their update history, safety
flags and their alert rows, memory items, controls, the client profile and its consent
records. The account row stays as an inactive, de-identified shell (username
``erased-<id>``, no email or names, unusable password) because audit events point at it:
the audit log is append-only in the database (an UPDATE trigger), so the ``SET NULL``
that deleting the user would need on those rows is refused, by design.

Evidence that an approved adapter already trained on cannot be taken back out of the
weights; the report lists it (group, run, version) before the rows are deleted. A round
still in flight or pending approval whose batch holds the client's evidence is stopped
instead (:func:`stop_rounds_using`): its version is failed and marked ``evidence_erased``
(a database constraint keeps such a version from ever being approved or served), the
other clients' evidence it held goes back to the buffer, and the report lists it. Copies of
the client's words elsewhere go too: a validation report's side-by-side entry made from
one of the client's groups keeps its place but loses its prompt and replies.

The former username is also replaced by ``erased-<id>`` in django-axes' login records and
the Django admin's log (:func:`scrub_username_elsewhere`).

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
from django.db.models import Q, Value
from django.utils import timezone

from webapp.accounts.models import ClientProfile, ConsentRecord, Role, User
from webapp.counseling.models import Course, Session, Turn
from webapp.learning.models import (
    AdapterVersion,
    CandidateGroup,
    PosteriorCell,
    PosteriorUpdate,
    TrainingRun,
)
from webapp.learning.schedule import lock_scope
from webapp.learning.services import return_evidence
from webapp.lib import audit
from webapp.memory.models import MemoryItem
from webapp.oversight.models import AuditEvent, ClientControl, SafetyFlag

APPROVED = (
    AdapterVersion.Status.APPROVED,
    AdapterVersion.Status.ACTIVE,
    AdapterVersion.Status.RETIRED,
)


class ErasureError(ValueError):
    """The erasure cannot run; the message says why."""


UNFINISHED = (
    AdapterVersion.Status.TRAINING,
    AdapterVersion.Status.VALIDATING,
    AdapterVersion.Status.PENDING_APPROVAL,
)


@dataclass(frozen=True)
class ErasureReport:
    event: AuditEvent
    counts: dict[str, int]
    used_evidence: list[dict[str, Any]]
    stopped_rounds: list[dict[str, Any]]


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


def stop_rounds_using(client: User) -> list[dict[str, Any]]:
    """Stop every round in flight or pending approval whose batch holds the client's
    evidence (inside the erasure's transaction); returns one entry per round stopped.

    1. Lock in the order every writer of these rows uses, so none of them can deadlock
       with an erasure: the learning scope (approvals and roll-backs take it first),
       the unfinished runs (running, or their version still training, validating or
       pending approval; a worker locks its run before touching its version or its
       evidence), those versions, then the client's groups. A round claiming now skips
       the groups (it claims ``SKIP LOCKED``); a claim that committed before is visible.
    2. Each such run whose batch or leases include one of the client's groups: fail the
       run (the worker's next fenced write then matches nothing and it stops), fail its
       version with ``evidence_erased`` set, and return the other clients' reserved
       evidence.
    """
    Run = TrainingRun.Status
    lock_scope()
    # A subquery, not a join: PostgreSQL refuses FOR UPDATE on an outer join's null side.
    unfinished = AdapterVersion.objects.filter(status__in=UNFINISHED).values("pk")
    runs = list(
        TrainingRun.objects.select_for_update()
        .filter(Q(status=Run.RUNNING) | Q(output_version_id__in=unfinished))
        .order_by("pk")
    )
    versions = [r.output_version_id for r in runs if r.output_version_id is not None]
    list(AdapterVersion.objects.select_for_update().filter(pk__in=versions).order_by("pk"))
    mine = list(
        CandidateGroup.objects.select_for_update()
        .filter(client=client)
        .values_list("pk", "lease_run_id")
    )
    pks = {pk for pk, _ in mine}
    leased = {run for _, run in mine if run is not None}
    if not pks:
        return []
    stopped = []
    for run in runs:
        batch = {int(i) for i in run.batch or [] if isinstance(i, int)}
        if not (batch & pks or run.pk in leased):
            continue
        note = "a client whose evidence was in this round's batch was erased"
        version = run.output_version
        was = version.status if version is not None else None
        if version is not None:
            AdapterVersion.objects.filter(pk=version.pk, status__in=UNFINISHED).update(
                status=AdapterVersion.Status.FAILED, evidence_erased=True,
                decision_note=f"{note}: this version can never be approved",
            )  # fmt: skip
        if run.status == Run.RUNNING:
            TrainingRun.objects.filter(pk=run.pk, status=Run.RUNNING).update(
                status=Run.FAILED, error=note, finished_at=timezone.now(), lease_expires_at=None
            )
        own = sum(1 for _, lease_run in mine if lease_run == run.pk)
        returned = return_evidence(run) - own  # the client's own rows are deleted below
        stopped.append(
            {
                "run": run.pk,
                "run_status": run.status,
                "version": version.name if version is not None else None,
                "version_status": was,
                "groups": len(batch & pks) or own,
                "returned_to_buffer": max(returned, 0),
            }
        )
    return stopped


def scrub_username_elsewhere(client: User, former: str) -> dict[str, int]:
    """The former username is gone from the tables that copied it outside our models:
    django-axes' login records (username; an attempt's GET/POST data too) and the Django
    admin's log (``object_repr`` and ``change_message`` of entries about the account or
    naming it). Each row keeps its place, with ``erased-<id>`` instead of the name."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.db.models.functions import Replace

    shell = f"erased-{client.pk}"
    counts = {
        "login records (name removed)": AccessLog.objects.filter(username=former).update(
            username=shell
        )
        + AccessFailureLog.objects.filter(username=former).update(username=shell)
        + AccessAttempt.objects.filter(username=former).update(
            username=shell, get_data="", post_data=""
        )
    }
    # Entries about the account, its profile or its consent records, and any whose
    # object is named by the username: matching every entry CONTAINING the name would
    # also rewrite other accounts' entries ("ann" inside "joanne").
    kinds = ContentType.objects.get_for_models(User, ClientProfile, ConsentRecord)
    consents = ConsentRecord.objects.filter(profile__user=client).values_list("pk", flat=True)
    about = (
        Q(content_type=kinds[User], object_id=str(client.pk))
        | Q(content_type=kinds[ClientProfile], object_id=str(client.pk))
        | Q(content_type=kinds[ConsentRecord], object_id__in=[str(pk) for pk in consents])
        | Q(object_repr=former)
        | Q(object_repr__startswith=f"{former} ")
    )
    entries = LogEntry.objects.filter(about)
    counts["admin log entries (name removed)"] = entries.count()
    entries.update(
        object_repr=Replace("object_repr", Value(former), Value(shell)),
        change_message=Replace("change_message", Value(former), Value(shell)),
    )
    return counts


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
        stopped = stop_rounds_using(client)
        former = {"id": client.pk, "username_hmac": username_hash(client.username)}
        keys = set(CandidateGroup.objects.filter(client=client).values_list("group_key", flat=True))
        counts["validation report entries"] = scrub_validation_reports(keys)
        counts.update(scrub_username_elsewhere(client, client.username))  # before the profile goes
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
            rounds_stopped=stopped,
        )
    return ErasureReport(event, counts, used, stopped)
