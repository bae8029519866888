"""Oversight: crisis flags and their delivery, per-client controls, the audit log."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class SafetyFlag(models.Model):
    """A message assessed as concern or crisis; a clinician must acknowledge it."""

    client = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="safety_flags"
    )
    session = models.ForeignKey(
        "counseling.Session", on_delete=models.CASCADE, related_name="safety_flags"
    )
    turn = models.ForeignKey(
        "counseling.Turn", on_delete=models.CASCADE, related_name="safety_flags"
    )
    level = models.CharField(max_length=8)
    categories = models.JSONField(default=list)
    # Ids of the rules that fired, never the client's words: plain at rest, and the database
    # refuses anything but short identifiers (migration 0003).
    matched = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["acknowledged_at", "created_at"]),
            models.Index(fields=["client", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.level} flag for {self.client_id} at {self.created_at:%Y-%m-%d %H:%M}"


class AlertOutbox(models.Model):
    """An alert to deliver by email; a Celery task drains it (retries survive restarts)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    flag = models.ForeignKey(SafetyFlag, on_delete=models.CASCADE, related_name="outbox")
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # A failed send waits until then (backoff across delivery runs, see tasks.deliver_alerts).
    next_attempt_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "created_at"]),
            models.Index(fields=["status", "next_attempt_at"]),
        ]

    def __str__(self) -> str:
        return f"alert {self.pk} to {self.recipient_id} ({self.status})"


class ClientControl(models.Model):
    """A clinician's controls for one client: AI pause and skill pins/exclusions."""

    client = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="control", primary_key=True
    )
    ai_paused = models.BooleanField(default=False)
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    pinned_skill = models.CharField(max_length=8, blank=True, default="")
    excluded_skills = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"controls for {self.client_id}"


class AuditEvent(models.Model):
    """Append-only record of who did what to whose data."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    action = models.CharField(max_length=64)
    subject = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    target = models.CharField(max_length=128, blank=True, default="")
    detail = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["-created_at"]),
            models.Index(fields=["subject", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_id}"

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.pk is not None and not self._state.adding:
            raise ValueError("audit events are append-only")
        super().save(*args, **kwargs)
