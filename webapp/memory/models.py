"""What the counselor remembers about a client, with its source and every correction."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class MemoryItem(models.Model):
    class Kind(models.TextChoices):
        RECAP = "recap"
        GOAL = "goal"
        FACT = "fact"
        HOMEWORK = "homework"

    class Origin(models.TextChoices):
        COUNSELOR = "counselor"
        CLIENT = "client"
        CLINICIAN = "clinician"

    client = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    text = models.TextField()
    origin = models.CharField(max_length=16, choices=Origin.choices)
    source_session = models.ForeignKey(
        "counseling.Session", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source_turn = models.PositiveIntegerField(null=True, blank=True)
    supersedes = models.OneToOneField(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="superseded_by"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        indexes = [models.Index(fields=["client", "retired_at", "created_at"])]
        constraints = [models.CheckConstraint(condition=~Q(text=""), name="memory_text_not_empty")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.text[:40]}"
