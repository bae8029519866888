"""Production configuration: encryption keys are required, the headers and cookies are
strict, and the pages need no inline script or style (so the strict CSP breaks nothing).
`check --deploy` itself is run by test_settings.py."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.urls import reverse

from webapp.accounts.tests.factories import (
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
    grant_all_consents,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = Fernet.generate_key().decode()


def production_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PSYEVO_", "SECURE_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="clinic.example.org",
        CSRF_TRUSTED_ORIGINS="https://clinic.example.org",
        PSYEVO_ENCRYPTION_KEYS=KEY,
        DATABASE_URL=settings.DATABASE_URL,
        REDIS_URL=settings.REDIS_URL,
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v != ""}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_cannot_start_without_encryption_keys() -> None:
    result = manage("check", env=production_env(PSYEVO_ENCRYPTION_KEYS=""))
    assert result.returncode != 0
    assert "PSYEVO_ENCRYPTION_KEYS is required when DEBUG=false" in result.stderr


def test_a_bad_key_stops_start_up_without_printing_it() -> None:
    bad = "x" * 40
    result = manage("check", env=production_env(PSYEVO_ENCRYPTION_KEYS=f"{KEY},{bad}"))
    assert result.returncode != 0
    assert "PSYEVO_ENCRYPTION_KEYS: key 2 of 2 is not a Fernet key" in result.stderr
    assert bad not in result.stderr and KEY not in result.stderr


PROBE = """
import json
from django.conf import settings
from django.test import Client
response = Client().get("/login/", secure=True, headers={"host": "clinic.example.org"})
print(json.dumps({
    "status": response.status_code,
    "headers": dict(response.headers),
    "csrf_cookie": response.cookies["csrftoken"].output(),
    "settings": {name: getattr(settings, name) for name in (
        "SESSION_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE",
        "CSRF_COOKIE_SECURE", "CSRF_COOKIE_HTTPONLY", "PSYEVO_REQUIRE_MFA",
    )},
}))
"""


def test_production_sends_strict_headers_and_cookies() -> None:
    # PSYEVO_TESTING: static files from the finders (no collectstatic manifest in a test).
    env = production_env(PSYEVO_TESTING="true", PSYEVO_REQUIRE_MFA="true")
    result = manage("shell", "-c", PROBE, env=env)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["status"] == 200
    headers = {k.lower(): v for k, v in probe["headers"].items()}
    assert headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    assert headers["x-frame-options"] == "DENY"
    csp = headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    cookie = probe["csrf_cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert probe["settings"] == {
        "SESSION_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_SECURE": True,
        "CSRF_COOKIE_HTTPONLY": True,
        "PSYEVO_REQUIRE_MFA": True,
    }


def test_mfa_is_required_by_default_in_production() -> None:
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.PSYEVO_REQUIRE_MFA)",
        env=production_env(PSYEVO_TESTING="true"),
    )
    # Under PSYEVO_TESTING the default is off (tests turn it on); without it, on.
    assert result.stdout.strip().splitlines()[-1] == "False"
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.PSYEVO_REQUIRE_MFA)",
        env=production_env(),
    )
    assert result.stdout.strip().splitlines()[-1] == "True", result.stderr


# --- a strict CSP needs pages without inline code ------------------------------------------

INLINE = [
    (re.compile(r"<script(?![^>]*\ssrc=)[^>]*>", re.I), "inline <script>"),
    (re.compile(r"<script[^>]*>[^<]+</script>", re.I), "script with a body"),
    (re.compile(r"<style", re.I), "<style> element"),
    (re.compile(r"\sstyle=", re.I), "style= attribute"),
    (re.compile(r"\son[a-z]+=", re.I), "event-handler attribute"),
    (re.compile(r"javascript:", re.I), "javascript: URL"),
]


@pytest.mark.django_db
def test_every_page_role_sees_works_under_a_strict_csp(client) -> None:  # type: ignore[no-untyped-def]
    from webapp.counseling import services

    profile = ClientProfileFactory()
    grant_all_consents(profile)
    session = services.start_session(profile.user)
    pages = [(None, reverse("login"))]
    pages += [
        (profile.user, url)
        for url in (
            reverse("my_sessions"),
            f"/sessions/{session.pk}/",
            reverse("my_memory"),
            reverse("consent"),
            "/me/data/",
        )
    ]
    pages += [(profile.clinician, reverse("clinician_home")), (AdminFactory(), "/console/")]
    pages += [(ClinicianFactory(), "/adapters/")]
    icons: set[str] = set()
    for user, url in pages:
        client.logout()
        if user is not None:
            client.force_login(user)
        response = client.get(url)
        assert response.status_code == 200, url
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        body = response.content.decode()
        for pattern, what in INLINE:
            match = pattern.search(body)
            assert match is None, f"{url}: {what}: {match.group(0) if match else ''}"
        # Its own icon, so the browser does not ask for /favicon.ico (a 404 on every page).
        icon = re.search(r'<link rel="icon" href="([^"]+)"', body)
        assert icon is not None, url
        icons.add(icon.group(1))
    for href in icons:
        served = client.get(href)
        assert served.status_code == 200 and b"<svg" in b"".join(served), href
