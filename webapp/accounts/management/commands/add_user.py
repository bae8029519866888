"""manage.py add_user USERNAME --role client|clinician|admin [--email ADDRESS]
[--modality cbt] [--clinician NAME]"""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.accounts.models import Modality, Role
from webapp.accounts.services import AccountError, create_account


class Command(BaseCommand):
    help = "Create an account. The password comes from NEW_USER_PASSWORD, else a prompt."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, help=f"one of {', '.join(Role.values)}")
        parser.add_argument("--modality", help=f"clients only: {', '.join(Modality.values)}")
        parser.add_argument("--clinician", help="clients only: username of the assigned clinician")
        parser.add_argument(
            "--email", default="", help="where crisis alerts reach a clinician by e-mail"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = os.environ.get("NEW_USER_PASSWORD")
        if not password:
            if not self.stdin_is_tty():
                raise CommandError("set NEW_USER_PASSWORD or run in a terminal to be prompted")
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the passwords differ")
        try:
            user = create_account(
                options["username"],
                role=options["role"],
                password=password,
                modality=options["modality"],
                clinician=options["clinician"],
                email=options["email"],
            )
        except AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created {user.role} {user.username}")
        if user.role == Role.CLINICIAN and not user.email:
            self.stderr.write(
                f"warning: {user.username} has no e-mail address: crisis alerts reach them on "
                "the dashboard only (add one with --email, or in the Django admin)"
            )

    @staticmethod
    def stdin_is_tty() -> bool:
        import sys

        return sys.stdin is not None and sys.stdin.isatty()
