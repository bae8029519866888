"""What the counselor remembers about a client, with its source and every correction."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.lib.crypto import EncryptedTextField


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
    text = EncryptedTextField()  # encrypted at rest; not searchable in SQL (webapp/lib/crypto.py)
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
        # The database sees ciphertext only (never empty): non-empty text is checked here,
        # and memory migration 0003 makes it refuse any value that is not a Fernet token.

    def __str__(self) -> str:
        return f"{self.kind}: {self.text[:40]}"

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not (self.text or "").strip():
            raise ValueError("memory text must not be empty")
        super().save(*args, **kwargs)
