"""Re-encrypt every encrypted column under the first key of PSYEVO_ENCRYPTION_KEYS.

The columns are found by :func:`webapp.lib.crypto.encrypted_fields` (text and JSON alike), so a
new encrypted field is rotated without a change here.

Rotation, step by step (README, Security):
1. generate a key (``rotate_keys --generate``) and put it FIRST, keeping the old key after it;
2. restart the processes, then run ``manage.py rotate_keys`` (batches, resumable, idempotent);
3. when it reports 0 rewritten on a second run, remove the old key and restart again.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from webapp.lib import audit, crypto

log = logging.getLogger("psyevo.security")


class Command(BaseCommand):
    help = (
        "Re-encrypt every encrypted column (transcripts, memories, evidence, validation "
        "reports) under the first key of PSYEVO_ENCRYPTION_KEYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size", type=int, default=500, help="rows per transaction (default 500)"
        )
        parser.add_argument(
            "--generate", action="store_true", help="print a new key and change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["generate"]:
            self.stdout.write(crypto.generate_key())
            return
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        totals = {"rewritten": 0, "current": 0}
        for model, field in crypto.encrypted_fields():
            try:
                report = crypto.rotate_table(
                    connection,
                    model._meta.db_table,
                    field.column,
                    batch_size=options["batch_size"],
                )
            except crypto.DecryptionError as exc:
                log.error("key rotation stopped: %s", exc)
                raise CommandError(
                    f"{exc} Rows rewritten before this batch stay readable under the first key."
                ) from None
            totals["rewritten"] += report.rewritten
            totals["current"] += report.current
            self.stdout.write(
                f"{model._meta.label}.{field.name}: {report.rewritten} re-encrypted, "
                f"{report.current} already under the first key"
            )
        audit.record(None, "keys.rotate", rewritten=totals["rewritten"], current=totals["current"])
        log.info("key rotation done: %(rewritten)d rewritten, %(current)d current", totals)
        self.stdout.write(self.style.SUCCESS("All encrypted text is under the first key."))
