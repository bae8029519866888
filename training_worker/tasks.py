"""Celery tasks of the ``training`` queue (run it with concurrency 1).

Tasks take ids, never model instances; the ``TrainingRun`` row is the source of truth,
never the result backend. ``acks_late`` with ``reject_on_worker_lost`` means a worker that
dies mid-round leaves the message to be delivered again; ``training_worker.round`` makes
that redelivery safe (terminal runs are no-ops, attempts are counted and fenced).
"""

from __future__ import annotations

import logging

from celery import shared_task

from training_worker.round import run_round

log = logging.getLogger(__name__)


def _log_progress(phase: str, done: int, total: int) -> None:
    log.info("lipo_round: %s %d/%d", phase, done, total)


@shared_task(
    name="training_worker.tasks.lipo_round",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def lipo_round(run_id: int) -> str:
    """Run (or resume after a lost worker) LiPO round ``run_id``; returns its outcome."""
    outcome = run_round(int(run_id), progress=_log_progress)
    log.info("lipo_round %s: %s", run_id, outcome)
    return outcome
