"""Celery tasks of the learning app (periodic upkeep; rounds themselves run in
``training_worker``)."""

from __future__ import annotations

from celery import shared_task

from webapp.learning import services


@shared_task(acks_late=True, reject_on_worker_lost=True)
def release_expired_leases() -> int:
    """Return evidence held by rounds whose worker died, even when no new round starts
    (rounds also call it when they begin). Run by celery beat."""
    return services.release_expired_leases()
