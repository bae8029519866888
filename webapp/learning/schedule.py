"""The one scheduler shared by every client of a learning scope (paper, App. C).

Completed sessions across all clients count towards the next LiPO round; every
``LIPO.sessions_per_round`` of them make a round eligible, and it is queued only once
an admissible batch exists ("training still waits for an admissible batch"). The web
side queues the round by task name and never imports ``training_worker``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Q, QuerySet, Subquery

from counselor_engine.lipo.batch import sample_batch
from counselor_engine.lipo.config import LipoConfig
from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord
from webapp.learning.models import (
    CandidateGroup,
    LearningScope,
    SimulationClient,
    TrainingRun,
)

if TYPE_CHECKING:
    from webapp.counseling.models import Session

log = logging.getLogger(__name__)

TASK_NAME = "training_worker.tasks.lipo_round"
SCOPE = "default"


@dataclass(frozen=True)
class GraphRef:
    """What the batch sampler needs of a buffered group: its modality and its edges."""

    pk: int
    modality: str
    edges: list[Any]


def lock_scope() -> LearningScope:
    """Lock the shared scope row: the scheduler's count, and every activation and erasure
    (before it stops the rounds that used the client's evidence), are serialised on it."""
    LearningScope.objects.get_or_create(name=SCOPE)
    return LearningScope.objects.select_for_update().get(name=SCOPE)


def trainable_clients() -> Q:
    """Evidence of real clients, and of simulated clients only when their run allowed
    training (``simulate --allow-training``): the lab's data never mixes into a round by
    default. A client whose profile is gone (erased) is not simulated."""
    # A subquery, not a join: claiming locks rows FOR UPDATE, which PostgreSQL refuses
    # on the nullable side of the outer join a reverse one-to-one lookup would make.
    held_back = ClientProfile.objects.filter(simulated=True, simulated_training=False)
    return ~Q(client_id__in=held_back.values("user_id")) & ~Q(
        client_id__in=training_withdrawn().values("user_id")
    )


def training_withdrawn() -> QuerySet[ClientProfile]:
    """Profiles whose latest training consent record is a withdrawal (issue 18: consent
    is checked where evidence is used - claimed or held out - not only where it was
    created; evidence returned from a rejected round after a withdrawal stays out)."""
    latest = (
        ConsentRecord.objects.filter(profile=OuterRef("pk"), purpose=ConsentPurpose.TRAINING)
        .order_by("-recorded_at", "-id")
        .values("granted")[:1]
    )
    return ClientProfile.objects.annotate(training=Subquery(latest)).filter(training=False)


def withdraw_evidence(client: Any) -> int:
    """The client withdrew training consent: their unclaimed (available) evidence leaves
    the buffer at once. A group a round holds already stays with that round; returns the
    number excluded. Conditional on the status, so a concurrent claim wins or loses whole
    rows: a row it reserved first is not touched here."""
    return CandidateGroup.objects.filter(
        client=client, buffer_status=CandidateGroup.Buffer.AVAILABLE
    ).update(buffer_status=CandidateGroup.Buffer.EXCLUDED, problem="training consent withdrawn")


def available_graphs(*, lock: bool = False) -> list[GraphRef]:
    """Available, admissible groups of the configured modalities, oldest first, leaving
    out simulated clients' groups unless their run allowed training.

    With ``lock`` the rows are locked ``FOR UPDATE SKIP LOCKED``: a concurrent round
    claiming evidence skips rows another one holds instead of waiting for them.
    """
    qs = CandidateGroup.objects.filter(
        trainable_clients(),
        buffer_status=CandidateGroup.Buffer.AVAILABLE,
        admissible=True,
        modality__in=settings.LIPO.modalities,
    ).order_by("created_at", "pk")
    if lock:
        qs = qs.select_for_update(skip_locked=True)
    rows = qs.values_list("pk", "modality", "edges")
    # Empty graphs carry no preference; the sampler would skip them anyway.
    return [GraphRef(pk, modality, list(edges)) for pk, modality, edges in rows if edges]


def pick_batch(graphs: list[GraphRef]) -> list[GraphRef] | None:
    """``counselor_engine.lipo.batch.sample_batch`` with the configured batch rules."""
    cfg: LipoConfig = settings.LIPO
    return sample_batch(
        graphs,
        edges=cfg.batch_edges,
        min_groups=cfg.min_groups,
        modalities=cfg.modalities,
        min_share=cfg.min_share,
    )


def training_queue() -> str:
    return str(settings.LIPO.queue)


def queue_round(run: TrainingRun) -> None:
    """Send the round's task once the current transaction commits (never before: the
    worker must find the run row)."""
    run_id, queue = run.pk, training_queue()
    transaction.on_commit(
        lambda: current_app.send_task(TASK_NAME, kwargs={"run_id": run_id}, queue=queue)
    )


@dataclass(frozen=True)
class LabSession:
    """How a simulated client's session may touch training (issue 8, ablations)."""

    run_id: int | None
    trains: bool  # simulate --allow-training (never with the no_lipo ablation)
    loss: str  # "lipo" or "pairwise_dpo": the loss of a round this session queues


def simulation_of(session: Session | None) -> LabSession | None:
    """None for a real client's session; else what its simulation run allows."""
    if session is None:
        return None
    profile = ClientProfile.objects.filter(user_id=session.client_id, simulated=True).first()
    if profile is None:
        return None
    link = SimulationClient.objects.filter(user_id=session.client_id).select_related("run").first()
    ablation = set(link.run.ablation) if link is not None else set()
    return LabSession(
        run_id=link.run_id if link is not None else None,
        trains=profile.simulated_training and "no_lipo" not in ablation,
        loss="pairwise_dpo" if "pairwise_dpo" in ablation else "lipo",
    )


def note_session_completed(session: Session | None) -> bool:
    """Count one completed session; queue a round when one is due. Returns True when a
    round was queued.

    Call it inside the session-end transaction: the increment commits with the session
    and the task is sent only on commit.

    0. A simulated client's session counts only when its run allowed training
       (``simulate --allow-training``, never with ``no_lipo``); a round it queues
       records the run and its loss (``pairwise_dpo`` ablation).
    1. Lock the scope row and add one to ``completed_sessions``.
    2. Below ``sessions_per_round``: done.
    3. A round already queued (not started) will see the newest evidence when it starts:
       reset the count and queue nothing more.
    4. No admissible batch in the buffer yet: keep the count (still eligible) so the next
       completed session checks again.
    5. Otherwise reset the count, create ``TrainingRun(status=queued, trigger=schedule)``
       and send ``lipo_round`` to the training queue on commit.
    """
    per_round: int = settings.LIPO.sessions_per_round
    lab = simulation_of(session)
    if lab is not None and not lab.trains:
        return False  # a simulated session never moves the shared scheduler by default
    with transaction.atomic():
        scope = lock_scope()
        LearningScope.objects.filter(pk=scope.pk).update(
            completed_sessions=F("completed_sessions") + 1, sessions_per_round=per_round
        )
        count = scope.completed_sessions + 1
        if count < per_round:
            return False
        if TrainingRun.objects.filter(status=TrainingRun.Status.QUEUED).exists():
            LearningScope.objects.filter(pk=scope.pk).update(completed_sessions=0)
            return False
        if pick_batch(available_graphs()) is None:
            log.info("round eligible after %d sessions; waiting for an admissible batch", count)
            return False
        LearningScope.objects.filter(pk=scope.pk).update(completed_sessions=0)
        config: dict[str, Any] = {"sessions": count, "session": getattr(session, "pk", None)}
        if lab is not None:
            config.update(simulation_run=lab.run_id, loss=lab.loss)
        run = TrainingRun.objects.create(trigger="schedule", config=config)
        queue_round(run)
    log.info("LiPO round %d queued after %d completed sessions", run.pk, count)
    return True


def queue_round_from_active(*, trigger: str) -> TrainingRun | None:
    """Queue a round now (it trains from the version active when it starts) unless one is
    already queued or running, or the buffer holds no admissible batch. Used when evidence
    comes back because a version was superseded. Returns the queued run."""
    with transaction.atomic():
        lock_scope()
        busy = TrainingRun.objects.filter(
            status__in=[TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING]
        )
        if busy.exists() or pick_batch(available_graphs()) is None:
            return None
        run = TrainingRun.objects.create(trigger=trigger, config={"reason": trigger})
        queue_round(run)
    log.info("LiPO round %d queued (%s)", run.pk, trigger)
    return run
