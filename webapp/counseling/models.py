"""Courses, sessions and the append-only transcript."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from webapp.accounts.models import Modality
from webapp.lib.crypto import EncryptedTextField


class Course(models.Model):
    """A client's planned series of sessions in one modality."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        COMPLETED = "completed"
        CLOSED = "closed"

    client = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="courses"
    )
    modality = models.CharField(max_length=8, choices=Modality.choices)
    planned_sessions = models.PositiveSmallIntegerField(default=8)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["client"], condition=Q(status="active"), name="one_active_course_per_client"
            ),
            models.CheckConstraint(
                condition=Q(planned_sessions__gte=1), name="course_planned_positive"
            ),
        ]
        indexes = [models.Index(fields=["client", "-created_at"])]

    def __str__(self) -> str:
        return f"course {self.pk} of {self.client_id} ({self.modality})"


class Session(models.Model):
    """One counseling session; it keeps the adapter version pinned when it started."""

    class Status(models.TextChoices):
        OPEN = "open"
        ENDED = "ended"
        ABANDONED = "abandoned"

    class Mode(models.TextChoices):
        GRAPH = "graph"
        STREAM_FIRST = "stream_first"

    course = models.ForeignKey(Course, on_delete=models.CASCADE, related_name="sessions")
    client = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sessions"
    )
    index = models.PositiveSmallIntegerField()  # zero-based place in the course
    adapter_version = models.ForeignKey(
        "learning.AdapterVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="sessions",
    )
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.GRAPH)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    rating = models.JSONField(null=True, blank=True)  # SRS items 0-10; null: ended without rating
    rated = models.BooleanField(default=False)
    internal_reward = models.FloatField(null=True, blank=True)
    session_reward = models.FloatField(null=True, blank=True)
    projected_reward = models.FloatField(null=True, blank=True)
    outcome = models.JSONField(null=True, blank=True)  # turn outcomes and credit, for the consoles

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["client"], condition=Q(status="open"), name="one_open_session_per_client"
            ),
            models.UniqueConstraint(fields=["course", "index"], name="unique_session_index"),
            models.CheckConstraint(
                condition=Q(status="open") | Q(ended_at__isnull=False),
                name="closed_session_has_end",
            ),
        ]
        indexes = [
            models.Index(fields=["client", "-started_at"]),
            models.Index(fields=["status", "ended_at"]),
        ]

    def __str__(self) -> str:
        return f"session {self.pk} ({self.index}) of {self.client_id}"


class Turn(models.Model):
    """One message in a session. Append-only: a database trigger refuses updates (except
    ``manage.py rotate_keys`` re-encrypting the text, see counseling migration 0004)."""

    class Role(models.TextChoices):
        CLIENT = "client"
        COUNSELOR = "counselor"
        CLINICIAN = "clinician"
        SYSTEM = "system"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    text = EncryptedTextField()  # encrypted at rest; not searchable in SQL (webapp/lib/crypto.py)
    skill = models.CharField(max_length=8, blank=True, default="")
    state_slot = models.CharField(max_length=48, blank=True, default="")
    safety_level = models.CharField(max_length=8, default="none")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    client_msg_id = models.CharField(max_length=64, blank=True, default="")
    # The seq of the client turn a reply answers. Messages sent while a reply is being
    # written are stored at once, so a reply is not always the turn after its message.
    in_reply_to = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="unique_turn_seq"),
            models.UniqueConstraint(
                fields=["session", "client_msg_id"],
                condition=~Q(client_msg_id=""),
                name="unique_client_message_id",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq} in session {self.session_id}"

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.pk is not None and not self._state.adding:
            raise ValueError("turns are append-only")
        super().save(*args, **kwargs)
