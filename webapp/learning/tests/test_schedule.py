"""The shared scheduler: every N completed sessions, once an admissible batch exists."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest
import redis
from django.conf import settings

from webapp.learning.models import LearningScope, TrainingRun
from webapp.learning.schedule import TASK_NAME, note_session_completed
from webapp.learning.tests.helpers import make_evidence, make_groups

pytestmark = pytest.mark.django_db


@pytest.fixture
def per_round(lipo_settings):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, sessions_per_round=3)
    return lipo_settings


def complete(n: int) -> list[bool]:
    return [note_session_completed(None) for _ in range(n)]


def queued_messages(queue: str) -> list[dict]:  # type: ignore[type-arg]
    """Messages waiting in the real Redis broker for ``queue`` (then removed)."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    raw = broker.lrange(queue, 0, -1)
    broker.delete(queue)
    return [json.loads(m) for m in raw]


def test_it_queues_a_round_every_n_sessions_on_commit(
    per_round, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    make_evidence()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert complete(3) == [False, False, True]
    run = TrainingRun.objects.get()
    assert run.status == "queued" and run.trigger == "schedule"
    assert len(callbacks) == 1
    [message] = queued_messages(per_round.LIPO.queue)
    assert message["headers"]["task"] == TASK_NAME
    _args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert kwargs == {"run_id": run.pk}
    assert LearningScope.objects.get().completed_sessions == 0


def test_it_waits_for_an_admissible_batch(per_round, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    make_groups(3, "cbt")  # one modality only: not admissible
    with django_capture_on_commit_callbacks() as callbacks:
        assert complete(4) == [False] * 4
    assert not callbacks and not TrainingRun.objects.exists()
    assert LearningScope.objects.get().completed_sessions == 4  # still eligible

    make_groups(3, "bt")
    with django_capture_on_commit_callbacks() as callbacks:
        assert complete(1) == [True]
    assert len(callbacks) == 1 and LearningScope.objects.get().completed_sessions == 0


def test_it_does_not_pile_up_queued_rounds(per_round, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    make_evidence()
    TrainingRun.objects.create()  # queued, not started yet
    with django_capture_on_commit_callbacks() as callbacks:
        assert complete(3) == [False] * 3
    assert not callbacks and TrainingRun.objects.count() == 1
