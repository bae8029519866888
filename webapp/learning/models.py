"""Learning state: skill decisions, posteriors, the evidence buffer, adapter versions."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from webapp.accounts.models import Modality
from webapp.lib.crypto import EncryptedJSONField


class AdapterVersion(models.Model):
    """One trained LoRA adapter. Only a clinician's approval makes it servable.

    training -> validating -> pending_approval -> approved -> active -> retired,
    or failed / rejected / superseded. At most one version is active (database
    constraint). ``superseded``: it was trained from a parent that is no longer the
    active version, so approving it would silently drop the update now active
    (``decision_note`` says which); it can never be approved.
    """

    class Status(models.TextChoices):
        TRAINING = "training"
        VALIDATING = "validating"
        PENDING_APPROVAL = "pending_approval"
        APPROVED = "approved"
        ACTIVE = "active"
        RETIRED = "retired"
        FAILED = "failed"
        REJECTED = "rejected"
        SUPERSEDED = "superseded"

    name = models.CharField(max_length=64, unique=True)
    parent = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="children"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.TRAINING)
    path = models.CharField(max_length=500, blank=True, default="")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    # Its side-by-side entries copy held-out prompts (clients' recent turns) and the replies
    # to them: encrypted at rest like the turns themselves (webapp/lib/crypto.py).
    validation_report = EncryptedJSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_sha256 = models.CharField(max_length=64, blank=True, default="")
    decision_note = models.TextField(blank=True, default="")
    activated_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    # Why the serving side could not (un)load it, e.g. the vLLM server refused; shown on the
    # approval page. Empty when the last attempt succeeded.
    load_error = models.TextField(blank=True, default="")
    # Set when a client whose evidence was in this version's batch was erased while the
    # round was in flight or pending approval (issue 18): it can never be served.
    evidence_erased = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=Q(status="active"), name="one_active_adapter"
            ),
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "active", "retired"])
                | (
                    Q(approved_by__isnull=False)
                    & Q(approved_at__isnull=False)
                    & ~Q(approved_sha256="")
                ),
                name="servable_adapter_is_approved",
            ),
            # Past training, a version has its files and their digest; an approval binds
            # exactly those files (the serving side re-checks them against approved_sha256).
            models.CheckConstraint(
                condition=Q(status__in=["training", "validating", "failed"])
                | (~Q(path="") & ~Q(sha256="")),
                name="reviewed_adapter_has_files",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "active", "retired"])
                | Q(approved_sha256=F("sha256")),
                name="approval_matches_files",
            ),
            models.CheckConstraint(
                condition=Q(evidence_erased=False)
                | ~Q(status__in=["approved", "active", "retired"]),
                name="erased_evidence_never_servable",
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class TrainingRun(models.Model):
    """One LiPO round: its evidence, its losses, and the version it produced."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        SKIPPED = "skipped"  # no admissible batch yet

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    parent_version = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    output_version = models.OneToOneField(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="training_run"
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    trigger = models.CharField(max_length=32, default="schedule")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    config = models.JSONField(default=dict)
    loss_curve = models.JSONField(default=list)
    edge_count = models.PositiveIntegerField(default=0)
    group_count = models.PositiveIntegerField(default=0)
    modality_shares = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")
    # Crash safety (training_worker.round): each delivery of the task is one attempt and
    # fences its writes on ``attempts``; ``phase`` and the lease say how far the live
    # attempt got and until when it is presumed alive.
    phase = models.CharField(max_length=16, blank=True, default="")
    attempts = models.PositiveSmallIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    batch = models.JSONField(default=list)  # CandidateGroup ids of the claimed batch
    timings = models.JSONField(default=dict)  # phase -> wall seconds

    class Meta:
        indexes = [models.Index(fields=["-created_at"]), models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"training run {self.pk} ({self.status})"


class LearningScope(models.Model):
    """The one shared scheduler (paper App. C): completed sessions since the last round."""

    name = models.CharField(max_length=32, unique=True, default="default")
    completed_sessions = models.PositiveIntegerField(default=0)
    sessions_per_round = models.PositiveIntegerField(default=5)

    def __str__(self) -> str:
        return f"scope {self.name}: {self.completed_sessions}/{self.sessions_per_round}"


class SkillDecision(models.Model):
    """The HBSP decision behind one counselor turn, with every valid skill's record."""

    turn = models.OneToOneField(
        "counseling.Turn", on_delete=models.CASCADE, related_name="decision"
    )
    state_slot = models.CharField(max_length=48)
    chosen = models.CharField(max_length=8)
    pinned = models.BooleanField(default=False)
    records = models.JSONField()  # skill -> {probability, mean, sd, draw, shared_value}

    def __str__(self) -> str:
        return f"{self.chosen} at {self.state_slot}"


class CandidateGroup(models.Model):
    """One turn's N candidates, judgments and SOCA graph: an evidence-buffer item.

    It belongs to exactly one client and keeps the generating version; edges never span
    clients. ``buffer_status`` moves available -> reserved (leased to a run) -> consumed,
    or back to available when a round fails.
    """

    class Buffer(models.TextChoices):
        AVAILABLE = "available"
        RESERVED = "reserved"
        CONSUMED = "consumed"
        EXCLUDED = "excluded"  # not admissible, or no training consent

    turn = models.OneToOneField("counseling.Turn", on_delete=models.CASCADE, related_name="group")
    session = models.ForeignKey(
        "counseling.Session", on_delete=models.CASCADE, related_name="groups"
    )
    client = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    modality = models.CharField(max_length=8, choices=Modality.choices)
    adapter_version = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    group_key = models.CharField(max_length=64, unique=True)
    mode = models.CharField(max_length=16)
    state_slot = models.CharField(max_length=48)
    skill = models.CharField(max_length=8)
    # The chat messages given to the model (the client's recent turns among them) and the
    # counselor texts: encrypted at rest, read whole in Python, never filtered in SQL.
    prompt = EncryptedJSONField()
    candidates = EncryptedJSONField()
    judgments = models.JSONField()
    support = models.JSONField()
    edges = models.JSONField()
    pointwise = models.JSONField()
    depths = models.JSONField()
    # None: no candidate was delivered whole; the client got the output guard's fallback.
    delivered = models.PositiveSmallIntegerField(null=True, blank=True)
    admissible = models.BooleanField()
    problem = models.CharField(max_length=200, blank=True, default="")
    beta = models.FloatField(default=0.1)
    edge_count = models.PositiveSmallIntegerField(default=0)
    # MCTSr-Zero turns: the search tree summary (nodes, Q values, calls, why it stopped),
    # for the clinician's "why this reply"; never read by training. Its nodes hold reply
    # texts, so it is encrypted too.
    search = EncryptedJSONField(null=True, blank=True)
    # The output guard's verdict per candidate (engine output_guard.GuardVerdict.to_dict):
    # rule ids and fixed reasons only, no candidate text, so it needs no encryption.
    # Training reads edges only, and the engine already dropped every edge a rejected
    # candidate won; the verdicts are for the clinician review and the reports.
    guard = models.JSONField(default=list, blank=True)
    buffer_status = models.CharField(
        max_length=16, choices=Buffer.choices, default=Buffer.AVAILABLE
    )
    lease_run = models.ForeignKey(
        TrainingRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["buffer_status", "modality", "created_at"]),
            models.Index(fields=["client", "created_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=~Q(buffer_status="reserved") | Q(lease_run__isnull=False),
                name="reserved_group_has_lease",
            ),
            models.CheckConstraint(
                condition=~Q(buffer_status="available") | Q(admissible=True),
                name="only_admissible_groups_available",
            ),
        ]

    def __str__(self) -> str:
        return f"group {self.group_key[:8]} ({self.buffer_status})"


class PosteriorCell(models.Model):
    """A client's private residual posterior for one (state slot, skill) cell."""

    client = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    modality = models.CharField(max_length=8, choices=Modality.choices)
    state_slot = models.CharField(max_length=48)
    skill = models.CharField(max_length=8)
    mean = models.FloatField()
    precision = models.FloatField()
    n = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["client", "state_slot", "skill"], name="unique_posterior_cell"
            ),
            models.CheckConstraint(
                condition=Q(precision__gt=0), name="posterior_precision_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.client_id} {self.state_slot} {self.skill}"


class PosteriorUpdate(models.Model):
    """Audit row of one Eq. 4 update at a session end."""

    cell = models.ForeignKey(PosteriorCell, on_delete=models.CASCADE, related_name="updates")
    session = models.ForeignKey(
        "counseling.Session", on_delete=models.CASCADE, related_name="posterior_updates"
    )
    turn = models.ForeignKey(
        "counseling.Turn", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    mean_before = models.FloatField()
    precision_before = models.FloatField()
    mean_after = models.FloatField()
    precision_after = models.FloatField()
    residual = models.FloatField()
    credit = models.FloatField()  # the trajectory return G_t
    shared_value = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["cell", "created_at"])]

    def __str__(self) -> str:
        return f"update of cell {self.cell_id} in session {self.session_id}"


# -- the simulation lab (issue 8) ----------------------------------------------------------


class SimulationRun(models.Model):
    """One ``manage.py simulate`` run: its parameters, status and the summary report.

    The external judge's scores live here and in :class:`SimulationReport` only: they are
    reporting, and nothing that feeds posteriors, evidence or losses reads these tables
    (paper App. G; a write-path test proves it).
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    strategy = models.CharField(max_length=16, default="sample")
    adapter = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    curriculum = models.BooleanField(default=False)
    ablation = models.JSONField(default=list)  # switch names, e.g. ["no_hbsp", "no_soca"]
    allow_training = models.BooleanField(default=False)
    seed = models.BigIntegerField(default=0)
    parameters = models.JSONField(default=dict)  # every command argument, as given
    report = models.JSONField(null=True, blank=True)  # the summary (simreport.summarise)
    report_path = models.CharField(max_length=500, blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(status="running") | Q(finished_at__isnull=False),
                name="finished_simulation_has_end",
            ),
        ]

    def __str__(self) -> str:
        return f"simulation run {self.pk} ({self.status})"

    @property
    def adapter_label(self) -> str:
        return self.adapter.name if self.adapter_id else "base model"


class SimulationClient(models.Model):
    """A synthetic client account made for one run, and the profile it plays."""

    run = models.ForeignKey(SimulationRun, on_delete=models.CASCADE, related_name="clients")
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="simulation"
    )
    profile_id = models.CharField(max_length=64)
    intent = models.CharField(max_length=64)
    modality = models.CharField(max_length=8, choices=Modality.choices)

    def __str__(self) -> str:
        return f"{self.profile_id} in run {self.run_id}"


class SimulationReport(models.Model):
    """One simulated session's external report (reporting only)."""

    run = models.ForeignKey(SimulationRun, on_delete=models.CASCADE, related_name="reports")
    client = models.ForeignKey(SimulationClient, on_delete=models.CASCADE, related_name="reports")
    session = models.ForeignKey(
        "counseling.Session", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    session_index = models.PositiveSmallIntegerField()
    state_key = models.CharField(max_length=32)  # the interaction state, e.g. conditional/high/t2
    turns = models.PositiveSmallIntegerField(default=0)
    closed_by_client = models.BooleanField(default=False)
    crisis = models.BooleanField(default=False)
    metrics = models.JSONField(default=dict)  # the four metric families
    passed = models.JSONField(default=dict)  # perspective -> bool
    external = models.JSONField(default=dict)  # ExternalReport.to_dict()
    session_reward = models.FloatField(null=True, blank=True)  # the internal one, for contrast
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "client", "session_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["client", "session_index"], name="one_report_per_simulated_session"
            ),
        ]

    def __str__(self) -> str:
        return f"report of {self.client_id} session {self.session_index}"
