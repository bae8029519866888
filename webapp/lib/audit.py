"""One call to write an audit event, so every app records actions the same way (reading
and filtering them: ``webapp.oversight.audit_query``)."""

from __future__ import annotations

from typing import Any

from webapp.accounts.models import User
from webapp.oversight.models import AuditEvent


def record(
    actor: User | None,
    action: str,
    *,
    subject: User | None = None,
    target: str = "",
    **detail: Any,
) -> AuditEvent:
    """Append an audit event. ``action`` is a dotted verb such as ``adapter.approve``;
    ``subject`` is the client whose data it concerns; ``detail`` must be JSON-ready."""
    actor = actor if actor is not None and getattr(actor, "pk", None) else None
    return AuditEvent.objects.create(
        actor=actor, action=action, subject=subject, target=target, detail=detail
    )
