"""``manage.py simulate``: run simulated clients through the product's session path.

Example: ``manage.py simulate --clients 10 --sessions 3 --strategy sample --adapter v7
--curriculum --ablation no_soca``. Clients run concurrently; a progress bar on stderr
counts finished sessions. The report is stored with the run (``/adapters/simulations/``)
and written as JSON + SVG under ``<PSYEVO_DATA_DIR>/reports/simulations/run-<id>/``,
whose path is printed. Bad arguments stop before anything is written; a run that fails
midway is marked failed with its reason.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.learning import simlab


class Command(BaseCommand):
    help = "Run simulated clients through the counselor and report (the simulation lab)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--clients", type=int, default=10, help="simulated clients")
        parser.add_argument("--sessions", type=int, default=3, help="sessions per client")
        parser.add_argument(
            "--strategy", default="sample", help="candidate strategy: sample | mctsr"
        )
        parser.add_argument(
            "--adapter",
            metavar="VERSION",
            help="an approved adapter version, or 'base' (default: the active version)",
        )
        parser.add_argument(
            "--curriculum", action="store_true", help="interaction states from the curriculum"
        )
        parser.add_argument(
            "--ablation",
            default="none",
            help="none, or a comma list of no_hbsp,no_soca,no_lipo,pairwise_dpo",
        )
        parser.add_argument(
            "--max-turns", type=int, default=None, help="exchanges per session (default: budget)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--allow-training",
            action="store_true",
            help="let these simulated sessions count towards LiPO rounds and their evidence "
            "be trained on (off by default: simulated data stays apart)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            lab = simlab.plan(
                clients=options["clients"],
                sessions=options["sessions"],
                strategy=options["strategy"],
                adapter=options["adapter"],
                curriculum=options["curriculum"],
                ablation=options["ablation"],
                max_turns=(
                    simlab.default_max_turns()
                    if options["max_turns"] is None
                    else options["max_turns"]
                ),
                seed=options["seed"],
                allow_training=options["allow_training"],
            )
        except simlab.LabError as exc:
            raise CommandError(str(exc)) from None
        total = lab.clients * lab.sessions
        with self._bar(total) as bar:
            try:
                run = simlab.run_lab(lab, progress=bar.update)
            except simlab.SimulationFailed as exc:
                raise CommandError(f"simulation failed: {exc}") from None
        summary = run.report or {}
        rates = ", ".join(
            f"{p} {'—' if v is None else f'{100 * v:.0f}%'}"
            for p, v in summary.get("pass_rates", {}).items()
        )
        self.stdout.write(f"simulation run {run.pk}: {total} sessions, pass rates: {rates}")
        self.stdout.write(f"report: {run.report_path}")

    def _bar(self, total: int) -> Any:
        from tqdm import tqdm

        return tqdm(
            total=total,
            unit="session",
            desc="simulate",
            file=sys.stderr,
        )
