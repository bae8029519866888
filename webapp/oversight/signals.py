"""Audit every role and clinician-assignment change, wherever it is made.

``pre_save`` reads the stored value and ``post_save`` compares, so a change made through
the Django admin, a management command or code is caught alike. (A bulk
``QuerySet.update`` sends no signals and is not caught; nothing in the product changes
these fields that way.)

The audit row is written when the transaction commits. The Django admin saves the object
and its ``LogEntry`` (which names the admin) in one transaction, so at commit time that
LogEntry is there and its user becomes the event's actor. Outside the admin there is no
such entry and the actor stays empty (e.g. ``manage.py add_user``); the event says which.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Model
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from django.utils import timezone

from webapp.accounts.models import ClientProfile, Role, User
from webapp.lib import audit


def _watched(update_fields: Any, name: str) -> bool:
    return update_fields is None or name in update_fields


@receiver(pre_save, sender=User, dispatch_uid="oversight.user_role_before")
def _user_before(sender: type[User], instance: User, update_fields: Any = None, **kw: Any) -> None:
    if _watched(update_fields, "role"):
        old = User.objects.filter(pk=instance.pk).values_list("role", flat=True).first()
        instance._audit_old = (old if instance.pk else None, timezone.now())  # type: ignore[attr-defined]


@receiver(post_save, sender=User, dispatch_uid="oversight.user_role_after")
def _user_after(sender: type[User], instance: User, created: bool, **kw: Any) -> None:
    if not hasattr(instance, "_audit_old"):
        return
    old, since = instance.__dict__.pop("_audit_old")
    # A new client account is the default, not a grant; every other role is audited.
    if old != instance.role and not (created and instance.role == Role.CLIENT):
        _on_commit(instance, since, "role.change", instance.pk, old, instance.role)


@receiver(pre_save, sender=ClientProfile, dispatch_uid="oversight.assignment_before")
def _profile_before(
    sender: type[ClientProfile], instance: ClientProfile, update_fields: Any = None, **kw: Any
) -> None:
    if _watched(update_fields, "clinician"):
        old = ClientProfile.objects.filter(pk=instance.pk).values_list("clinician_id", flat=True)
        instance._audit_old = (old.first(), timezone.now())  # type: ignore[attr-defined]


@receiver(post_save, sender=ClientProfile, dispatch_uid="oversight.assignment_after")
def _profile_after(
    sender: type[ClientProfile], instance: ClientProfile, created: bool, **kw: Any
) -> None:
    if not hasattr(instance, "_audit_old"):
        return
    old, since = instance.__dict__.pop("_audit_old")
    if old != instance.clinician_id:
        _on_commit(
            instance, since, "assignment.change", instance.user_id, _name(old),
            _name(instance.clinician_id),
        )  # fmt: skip


def _name(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    return User.objects.filter(pk=user_id).values_list("username", flat=True).first()


def _on_commit(
    obj: Model, since: Any, action: str, subject_id: int, before: Any, after: Any
) -> None:
    model, pk = type(obj), obj.pk

    def write() -> None:
        content_type = ContentType.objects.get_for_model(model)
        entry = (
            LogEntry.objects.filter(
                content_type=content_type, object_id=str(pk), action_time__gte=since
            )
            .order_by("action_time")
            .first()
        )
        audit.record(
            User.objects.filter(pk=entry.user_id).first() if entry else None,
            action,
            subject=User.objects.filter(pk=subject_id).first(),
            target=f"{content_type.app_label}.{content_type.model}:{pk}",
            before=before,
            after=after,
            via="django-admin" if entry else "code",
        )

    transaction.on_commit(write)
