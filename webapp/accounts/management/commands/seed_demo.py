"""manage.py seed_demo: demo accounts with random passwords printed once.

One admin, two clinicians and four clients across modalities. Passwords are generated
here and never stored anywhere but as hashes, so none can leak from the repository.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord, Role, User
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

    def handle(self, *args: Any, **options: Any) -> None:
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
                user = create_account(
                    username, role=role, password=password, modality=modality, clinician=clinician
                )
                if role == Role.CLIENT:
                    profile = ClientProfile.objects.get(user=user)
                    for purpose in ConsentPurpose:
                        ConsentRecord.objects.create(profile=profile, purpose=purpose, granted=True)
                lines.append(f"{role} {username} {password}")
        self.stdout.write("\n".join(lines))
