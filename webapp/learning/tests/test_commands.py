"""Operator commands: ``lipo_round --now`` in the foreground and ``adapters``."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from webapp.accounts.tests.factories import (
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
    UserFactory,
)
from webapp.learning import services
from webapp.learning.models import TrainingRun
from webapp.learning.tests.helpers import make_evidence

pytestmark = pytest.mark.django_db


def test_lipo_round_now_runs_in_the_foreground_and_its_operator_cannot_approve(lipo_settings):  # type: ignore[no-untyped-def]
    operator = ClinicianFactory(username="operator")
    make_evidence()
    out, err = io.StringIO(), io.StringIO()

    call_command("lipo_round", "--now", "--started-by", "operator", stdout=out, stderr=err)

    run = TrainingRun.objects.get()
    assert run.trigger == "operator" and run.started_by == operator
    assert f"-> {run.output_version.name} (pending_approval)" in out.getvalue()
    assert "validate" in err.getvalue()  # the progress bar went to stderr
    with pytest.raises(services.DecisionRefused):
        services.approve(run.output_version, operator)
    services.approve(run.output_version, ClinicianFactory())

    listing = io.StringIO()
    call_command("adapters", "--runs", stdout=listing)
    lines = listing.getvalue().splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert run.output_version.name in lines[1] and "active" in lines[1]
    assert any(line.startswith(f"{run.pk} ") and "succeeded" in line for line in lines)


def test_lipo_round_now_runs_the_trainers_entry_point_named_in_settings(settings):  # type: ignore[no-untyped-def]
    from django.utils.module_loading import import_string

    from training_worker.round import run_round

    assert import_string(settings.PSYEVO_FOREGROUND_ROUND) is run_round


def test_lipo_round_without_now_queues_on_commit(lipo_settings, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    import redis
    from django.conf import settings

    AdminFactory(username="op")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        call_command("lipo_round", "--started-by", "op", stdout=io.StringIO())
    assert len(callbacks) == 1 and TrainingRun.objects.get().status == "queued"
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.llen(lipo_settings.LIPO.queue) == 1
    broker.delete(lipo_settings.LIPO.queue)


@pytest.mark.parametrize("args", [
    [],  # no operator: separation of duties could be bypassed
    ["--started-by", ""],
    ["--started-by", "nobody"],
    ["--started-by", "a-client"],
    ["--started-by", "gone"],
])  # fmt: skip
def test_lipo_round_refuses_without_a_known_staff_operator(lipo_settings, args):  # type: ignore[no-untyped-def]
    from django.core.management.base import CommandError

    ClientProfileFactory(user=UserFactory(username="a-client"))
    ClinicianFactory(username="gone", is_active=False)

    with pytest.raises(CommandError):
        call_command("lipo_round", *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert not TrainingRun.objects.exists()
