"""Users, their roles, client profiles and consent records."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser, UserManager
from django.db import models
from django.db.models import Q


class Role(models.TextChoices):
    CLIENT = "client", "Client"
    CLINICIAN = "clinician", "Clinician"
    ADMIN = "admin", "Admin"


class Modality(models.TextChoices):
    CBT = "cbt", "Cognitive behavioural therapy"
    BT = "bt", "Behavioural therapy"
    HET = "het", "Humanistic-existential therapy"
    PDT = "pdt", "Psychodynamic therapy"
    PMT = "pmt", "Postmodern therapy"


class ConsentPurpose(models.TextChoices):
    COUNSELING = "counseling", "Counseling with the AI counselor"
    MEMORY = "memory", "Remembering things across sessions"
    TRAINING = "training", "Using my sessions to improve the shared counselor"
    CLINICIAN_REVIEW = "clinician_review", "Review of my sessions by my clinician"


class PsyEvoUserManager(UserManager["User"]):
    def create_superuser(self, username, email=None, password=None, **extra_fields):  # type: ignore[no-untyped-def, override]
        extra_fields.setdefault("role", Role.ADMIN)
        return super().create_superuser(username, email, password, **extra_fields)


class User(AbstractUser):
    """A person who logs in. ``role`` decides what they may see; admin implies staff."""

    role = models.CharField(max_length=16, choices=Role.choices, default=Role.CLIENT)

    objects = PsyEvoUserManager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=[r.value for r in Role]), name="user_role_valid"
            ),
            # Only admins may enter the Django admin; a superuser is always an admin.
            models.CheckConstraint(
                condition=Q(is_staff=False) | Q(role=Role.ADMIN), name="user_staff_is_admin"
            ),
            models.CheckConstraint(
                condition=Q(is_superuser=False) | Q(role=Role.ADMIN),
                name="user_superuser_is_admin",
            ),
        ]

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.is_staff = self.role == Role.ADMIN
        if self.role != Role.ADMIN:
            self.is_superuser = False
        super().save(*args, **kwargs)

    @property
    def is_client(self) -> bool:
        return self.role == Role.CLIENT

    @property
    def is_clinician(self) -> bool:
        return self.role == Role.CLINICIAN

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


class ClientProfile(models.Model):
    """What the product knows about a client beyond login: modality and clinician."""

    user = models.OneToOneField(
        User, on_delete=models.CASCADE, related_name="client_profile", primary_key=True
    )
    modality = models.CharField(max_length=8, choices=Modality.choices)
    clinician = models.ForeignKey(
        User,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="assigned_clients",
        limit_choices_to={"role": Role.CLINICIAN},
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # A synthetic client of the simulation lab (``manage.py simulate``). It never logs in,
    # has no clinician, is left out of every client list and console, and its evidence
    # stays out of training rounds unless the run that made it allowed it (below).
    simulated = models.BooleanField(default=False, db_index=True)
    # ``simulate --allow-training``: this simulated client's sessions may count towards
    # LiPO rounds and its candidate groups may be claimed. Meaningless for real clients.
    simulated_training = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(modality__in=[m.value for m in Modality]),
                name="clientprofile_modality_valid",
            ),
            models.CheckConstraint(
                condition=Q(simulated=True) | Q(simulated_training=False),
                name="clientprofile_sim_training_only_simulated",
            ),
            # No clinician ever has a simulated client on their list or gets its alerts.
            models.CheckConstraint(
                condition=Q(simulated=False) | Q(clinician__isnull=True),
                name="clientprofile_simulated_unassigned",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user.username} ({self.modality})"

    def has_consent(self, purpose: str) -> bool:
        """The latest record for a purpose decides; no record means no consent."""
        latest = self.consents.filter(purpose=purpose).order_by("-recorded_at", "-id").first()
        return bool(latest and latest.granted)

    def consent_state(self) -> dict[str, ConsentRecord | None]:
        state: dict[str, ConsentRecord | None] = dict.fromkeys(ConsentPurpose.values, None)
        for record in self.consents.order_by("recorded_at", "id"):
            state[record.purpose] = record
        return state


class ConsentRecord(models.Model):
    """Append-only: each grant or withdrawal is a new row, so the history is kept."""

    profile = models.ForeignKey(ClientProfile, on_delete=models.CASCADE, related_name="consents")
    purpose = models.CharField(max_length=32, choices=ConsentPurpose.choices)
    granted = models.BooleanField()
    recorded_at = models.DateTimeField(auto_now_add=True)
    recorded_by = models.ForeignKey(
        User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        indexes = [models.Index(fields=["profile", "purpose", "-recorded_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(purpose__in=[p.value for p in ConsentPurpose]),
                name="consent_purpose_valid",
            ),
        ]

    def __str__(self) -> str:
        verb = "granted" if self.granted else "withdrew"
        return f"{self.profile.user.username} {verb} {self.purpose} at {self.recorded_at:%Y-%m-%d}"

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.pk is not None:
            raise ValueError("consent records are append-only; record a new one instead")
        super().save(*args, **kwargs)
