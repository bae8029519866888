"""The periodic upkeep the `beat` process schedules exists and does its job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from webapp.celery import app


def test_every_scheduled_task_is_a_registered_task() -> None:
    app.loader.import_default_modules()
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert names == {
        "webapp.oversight.tasks.deliver_alerts",
        "webapp.oversight.tasks.escalate_overdue_flags",
        "webapp.learning.tasks.release_expired_leases",
    }
    assert names <= set(app.tasks)
    assert all(entry["schedule"] > 0 for entry in settings.CELERY_BEAT_SCHEDULE.values())


@pytest.mark.django_db
def test_the_lease_task_returns_evidence_of_a_worker_that_died() -> None:
    from webapp.learning.models import CandidateGroup, TrainingRun
    from webapp.learning.tasks import release_expired_leases
    from webapp.learning.tests.helpers import make_groups

    groups = make_groups(3)
    past = timezone.now() - timedelta(minutes=1)
    run = TrainingRun.objects.create(
        status="running", phase="optimise", attempts=1, lease_expires_at=past
    )
    CandidateGroup.objects.filter(pk__in=[g.pk for g in groups]).update(
        buffer_status="reserved", lease_run=run, lease_expires_at=past
    )
    assert release_expired_leases.apply().get() == 3
    assert set(CandidateGroup.objects.values_list("buffer_status", flat=True)) == {"available"}
    run.refresh_from_db()
    assert run.status == "failed"
