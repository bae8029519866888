from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from webapp.accounts.models import ClientProfile, User
from webapp.accounts.tests.factories import ClinicianFactory

pytestmark = pytest.mark.django_db
GOOD = "a perfectly long passphrase"


@pytest.fixture
def password(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NEW_USER_PASSWORD", GOOD)


def test_it_creates_a_client_with_modality_and_clinician(password):  # type: ignore[no-untyped-def]
    ClinicianFactory(username="drx")
    call_command("add_user", "pat", "--role", "client", "--modality", "pdt", "--clinician", "drx")
    profile = ClientProfile.objects.get(user__username="pat")
    assert profile.modality == "pdt"
    assert profile.clinician.username == "drx"
    assert profile.user.check_password(GOOD)


def test_it_creates_an_admin_who_can_use_the_django_admin(password):  # type: ignore[no-untyped-def]
    call_command("add_user", "boss", "--role", "admin")
    user = User.objects.get(username="boss")
    assert user.is_staff and user.is_superuser


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["x", "--role", "wizard"], "unknown role 'wizard'"),
        (["x", "--role", "client", "--modality", "astrology"], "unknown modality 'astrology'"),
        (["x", "--role", "client", "--clinician", "nobody"], "no clinician named 'nobody'"),
        (["x", "--role", "clinician", "--modality", "cbt"], "apply to clients only"),
        (["x", "--role", "clinician", "--email", "dr at clinic"], "not an e-mail address"),
    ],
)
def test_it_rejects_bad_input_and_creates_nothing(password, argv, message):  # type: ignore[no-untyped-def]
    with pytest.raises(CommandError, match=message):
        call_command("add_user", *argv)
    assert not User.objects.filter(username="x").exists()


def test_a_clinicians_email_is_where_crisis_alerts_go(password, capsys):  # type: ignore[no-untyped-def]
    call_command("add_user", "drm", "--role", "clinician", "--email", " drm@clinic.example ")
    assert User.objects.get(username="drm").email == "drm@clinic.example"
    assert capsys.readouterr().err == ""


def test_a_clinician_without_email_is_warned_about_alerts(password, capsys):  # type: ignore[no-untyped-def]
    call_command("add_user", "drn", "--role", "clinician")
    assert User.objects.get(username="drn").email == ""
    assert "no e-mail address: crisis alerts reach them on the dashboard only" in (
        capsys.readouterr().err
    )


def test_it_rejects_a_weak_password(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NEW_USER_PASSWORD", "123")
    with pytest.raises(CommandError, match="password rejected"):
        call_command("add_user", "weak", "--role", "client")
    assert not User.objects.filter(username="weak").exists()


def test_it_rejects_a_duplicate_username(password):  # type: ignore[no-untyped-def]
    call_command("add_user", "twice", "--role", "client")
    with pytest.raises(CommandError, match="already exists"):
        call_command("add_user", "twice", "--role", "client")


def test_it_exits_nonzero_with_one_line_from_the_shell():  # type: ignore[no-untyped-def]
    env = {**os.environ, "NEW_USER_PASSWORD": GOOD}
    result = subprocess.run(
        [sys.executable, "manage.py", "add_user", "y", "--role", "wizard"],
        cwd=Path(__file__).resolve().parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "CommandError: unknown role 'wizard'; choose one of client, clinician, admin"
    ]


def test_it_seeds_demo_accounts_with_printed_passwords(capsys):  # type: ignore[no-untyped-def]
    call_command("seed_demo")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 7
    roles = [line.split()[0] for line in lines]
    assert (
        roles.count("admin") == 1 and roles.count("clinician") == 2 and roles.count("client") == 4
    )
    for line in lines:
        role, username, password = line.split()
        user = User.objects.get(username=username)
        assert user.role == role and user.check_password(password)
    assert len({p.modality for p in ClientProfile.objects.all()}) >= 3
    # Demo crisis alerts are "sent" (printed in DEBUG), not shown as failed.
    clinicians = User.objects.filter(role="clinician")
    assert sorted(c.email for c in clinicians) == [
        f"{c.username}@clinic.example" for c in clinicians.order_by("email")
    ]
    assert not User.objects.exclude(role="clinician").exclude(email="").exists()
    for profile in ClientProfile.objects.all():  # agreeing is each person's own act
        assert not any(profile.consent_state().values())
    with pytest.raises(CommandError, match="already exist"):
        call_command("seed_demo")


def test_seed_demo_if_empty_prints_passwords_only_on_the_start_that_made_them(capsys):  # type: ignore[no-untyped-def]
    call_command("seed_demo", "--if-empty")
    first = capsys.readouterr().out.strip().splitlines()
    assert len(first) == 7 and User.objects.count() == 7
    call_command("seed_demo", "--if-empty")
    assert capsys.readouterr().out == "" and User.objects.count() == 7


def test_seed_demo_if_empty_creates_nothing_beside_existing_accounts(capsys):  # type: ignore[no-untyped-def]
    User.objects.create_user("clinic_admin", password="x", role="admin")
    call_command("seed_demo", "--if-empty")
    assert capsys.readouterr().out == ""
    assert list(User.objects.values_list("username", flat=True)) == ["clinic_admin"]
