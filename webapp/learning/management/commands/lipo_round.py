"""``manage.py lipo_round``: queue a LiPO round, or run one now in the foreground.

``--now`` runs the round in this process (a progress bar on stderr) instead of on the
Celery ``training`` queue, through the trainer's entry point that
``settings.PSYEVO_FOREGROUND_ROUND`` names: the web side never imports ``training_worker``,
it names the trainer's code as it names the Celery task. ``--started-by USERNAME`` is
required: it records the operator (an active clinician or admin), who then cannot approve
the version the round produces; without it a clinician could start a round anonymously
and approve its output, and separation of duties would be gone. Expired evidence leases
are released first.
"""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils.module_loading import import_string

from webapp.accounts.models import Role, User
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.schedule import queue_round
from webapp.learning.services import release_expired_leases


class Command(BaseCommand):
    help = "Queue a LiPO training round (or run it now with --now)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--now", action="store_true", help="run in the foreground")
        parser.add_argument(
            "--started-by", metavar="USERNAME", required=True,
            help="the operator (an active clinician or admin; required)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        name = (options.get("started_by") or "").strip()
        if not name:
            raise CommandError("--started-by USERNAME is required (the operator)")
        operator = User.objects.filter(
            username=name, is_active=True, role__in=[Role.CLINICIAN, Role.ADMIN]
        ).first()
        if operator is None:
            raise CommandError(f"no active clinician or admin {name!r}")
        released = release_expired_leases()
        if released:
            self.stderr.write(f"released {released} evidence groups from lost rounds")
        with transaction.atomic():
            run = TrainingRun.objects.create(
                trigger="operator" if options["now"] else "operator-queued", started_by=operator
            )
            if not options["now"]:
                queue_round(run)
        if not options["now"]:
            self.stdout.write(f"round {run.pk} queued on the training queue")
            return
        outcome = self._run_now(run.pk)
        run.refresh_from_db()
        version: AdapterVersion | None = run.output_version
        self.stdout.write(
            f"round {run.pk}: {outcome}"
            + (f" -> {version.name} ({version.status})" if version else "")
            + (f": {run.error}" if run.error else "")
        )
        if outcome == "failed":
            raise CommandError(f"round {run.pk} failed: {run.error}")

    def _run_now(self, run_id: int) -> str:
        from tqdm import tqdm  # the progress bar: only for a foreground round

        run_round = import_string(settings.PSYEVO_FOREGROUND_ROUND)

        total = settings.LIPO.steps + 4  # claim, reference, steps..., save, validate
        with tqdm(
            total=total, desc="claim", unit="phase", file=getattr(self.stderr, "_out", sys.stderr)
        ) as bar:

            def progress(phase: str, done: int, of: int) -> None:
                bar.set_description(phase if of == 1 else f"{phase} {done}/{of}")
                bar.update(1)

            return run_round(run_id, progress=progress)
