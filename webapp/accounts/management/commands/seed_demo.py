"""manage.py seed_demo: demo accounts with random passwords printed once.

One admin, two clinicians and four clients across modalities. Passwords are generated
here and never stored anywhere but as hashes, so none can leak from the repository.

The demo clinicians get addresses at ``clinic.example`` (a domain reserved for examples):
in DEBUG the e-mail backend prints messages, so a demo crisis shows its alert e-mail in
``bin/up``'s output, as a clinic's would be sent, instead of a failed-alert banner.

The demo clients are given no consent: agreeing to counseling, memory, training and
clinician review is each person's own act on "My choices", and a newcomer trying the
product should meet that page exactly as a client would.

``--if-empty`` (used by ``bin/up`` on a first start in DEBUG) creates the accounts only
when the database has no account at all, and otherwise prints nothing: the passwords are
shown once, on the start that made them, and never again.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from webapp.accounts.models import Role, User
from webapp.accounts.services import create_account

DEMO = [
    ("demo_admin", Role.ADMIN, None, None),
    ("dr_rivera", Role.CLINICIAN, None, None),
    ("dr_okafor", Role.CLINICIAN, None, None),
    ("alex", Role.CLIENT, "cbt", "dr_rivera"),
    ("sam", Role.CLIENT, "het", "dr_rivera"),
    ("jordan", Role.CLIENT, "pdt", "dr_okafor"),
    ("casey", Role.CLIENT, "bt", "dr_okafor"),
]


class Command(BaseCommand):
    help = "Create demo accounts; prints one 'role username password' line each."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="do nothing (and print nothing) when any account exists",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and User.objects.exists():
            return
        taken = sorted(
            User.objects.filter(username__in=[d[0] for d in DEMO]).values_list(
                "username", flat=True
            )
        )
        if taken:
            raise CommandError(f"demo accounts already exist: {', '.join(taken)}")
        lines = []
        with transaction.atomic():
            for username, role, modality, clinician in DEMO:
                password = secrets.token_urlsafe(12)
                email = f"{username}@clinic.example" if role == Role.CLINICIAN else ""
                create_account(
                    username,
                    role=role,
                    password=password,
                    modality=modality,
                    clinician=clinician,
                    email=email,
                )
                lines.append(f"{role} {username} {password}")
        self.stdout.write("\n".join(lines))
