"""Secrets never reach a log: not passwords, SECRET_KEY, encryption keys nor session ids.

Every logger is turned up to DEBUG while the flows that handle secrets run (log-in right and
wrong, a password change, key rotation, a counseling turn); then no record may contain one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from webapp.accounts.tests.factories import (
    PASSWORD,
    AdminFactory,
    ClientProfileFactory,
    UserFactory,
    grant_all_consents,
)
from webapp.counseling import services
from webapp.counseling.tests.helpers import connect, frames_until
from webapp.lib.logsafety import REDACTED, RedactSecretsFilter

NEW_PASSWORD = "a brand new passphrase 93"
# Loggers that do not propagate to the root logger (settings.LOGGING) need their own handler.
NON_PROPAGATING = ["django.security", "psyevo.security", "axes"]


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        formatter = logging.Formatter("%(name)s %(message)s")
        return "\n".join(formatter.format(r) for r in self.records)


@pytest.fixture
def captured() -> Iterator[ListHandler]:
    handler = ListHandler()
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in NON_PROPAGATING)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def assert_no_secrets(log: str, *extra: str) -> None:
    secrets = [
        settings.SECRET_KEY,
        *settings.PSYEVO_ENCRYPTION_KEYS,
        PASSWORD,
        NEW_PASSWORD,
        *extra,
    ]
    for secret in secrets:
        assert secret not in log, f"a secret ({secret[:4]}...) appeared in the log"


@pytest.mark.django_db
def test_log_in_password_change_and_key_rotation_log_no_secret(client, settings, captured):  # type: ignore[no-untyped-def]
    old_key = settings.PSYEVO_ENCRYPTION_KEYS[0]
    user, admin = UserFactory(), AdminFactory()
    captured.records.clear()  # factory-boy logs the test password it sets: not our code
    client.post(reverse("login"), {"username": user.username, "password": "wrong " + PASSWORD})
    client.post(reverse("login"), {"username": user.username, "password": PASSWORD})
    cookies = [client.cookies[settings.SESSION_COOKIE_NAME].value]

    staff = Client()
    staff.post(reverse("login"), {"username": admin.username, "password": PASSWORD})
    response = staff.post(
        "/admin/password_change/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert response.status_code == 302
    admin.refresh_from_db()
    assert admin.check_password(NEW_PASSWORD), "the password change did not happen"
    cookies.append(staff.cookies[settings.SESSION_COOKIE_NAME].value)

    new_key = Fernet.generate_key().decode()
    settings.PSYEVO_ENCRYPTION_KEYS = [new_key, old_key]
    call_command("rotate_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert captured.records, "nothing was captured: the test would prove nothing"
    assert_no_secrets(captured.text(), old_key, new_key, *cookies)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
async def test_a_counseling_turn_logs_no_secret(tiny_engine, captured):  # type: ignore[no-untyped-def]
    def start():  # type: ignore[no-untyped-def]
        profile = ClientProfileFactory()
        grant_all_consents(profile)
        return profile, services.start_session(profile.user)

    profile, session = await sync_to_async(start)()
    captured.records.clear()  # factory-boy logs the test password it sets: not our code
    comm, connected, _, session_key = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await comm.send_to(
        text_data=json.dumps({"type": "message", "text": "I feel low", "client_msg_id": "m1"})
    )
    await frames_until(comm, r'class="turn turn-counselor"')
    await comm.disconnect()
    assert_no_secrets(captured.text(), session_key)


def test_the_log_filter_redacts_known_secrets_in_messages_and_tracebacks(settings) -> None:  # type: ignore[no-untyped-def]
    key = settings.PSYEVO_ENCRYPTION_KEYS[0]
    settings.EMAIL_HOST_PASSWORD = "smtp-password-123"
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "config %s and %s", (settings.SECRET_KEY, key), None
    )
    try:
        raise RuntimeError("login to smtp failed with smtp-password-123")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactSecretsFilter().filter(record) is True
    line = logging.Formatter().format(record)
    assert settings.SECRET_KEY not in line and key not in line
    assert "smtp-password-123" not in line
    assert line.startswith(f"config {REDACTED} and {REDACTED}")
    assert line.endswith(f"failed with {REDACTED}")


def test_the_console_handler_carries_the_filter() -> None:
    handler = settings.LOGGING["handlers"]["console"]
    assert "redact_secrets" in handler["filters"]
