"""Production settings: the deploy check is clean and missing variables stop start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "ALLOWED_HOSTS", "DEBUG")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_the_deploy_check_in_production() -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DEBUG="false",
        SECRET_KEY="k" * 20 + "-Zq8!vL2#pW9$rT5^yU1&iO7*aS3(dF6)gH0",
        ALLOWED_HOSTS="clinic.example.org",
        PSYEVO_ENCRYPTION_KEYS="P3kxZ2n1o8cJ3c0Yl8mW8yq2dX0nJc2c9J6yQvQ9Z3k=",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_it_stops_with_one_line_naming_a_missing_variable() -> None:
    result = manage("check", DEBUG="false", ALLOWED_HOSTS="clinic.example.org")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "ImproperlyConfigured: environment variable SECRET_KEY is required when DEBUG=false"
    ]
    result = manage("check", DEBUG="false", SECRET_KEY="x" * 60)
    assert result.returncode != 0
    assert "ALLOWED_HOSTS" in result.stderr.strip().splitlines()[-1]


def test_it_fails_loudly_on_a_malformed_value() -> None:
    for env, name in (
        (dict(DEBUG="maybe"), "DEBUG"),
        (dict(DATABASE_URL="mysql://x/y"), "DATABASE_URL"),
        (dict(AXES_FAILURE_LIMIT="many"), "AXES_FAILURE_LIMIT"),
        (dict(LIPO_STEPS="three"), "LIPO_STEPS"),
        (dict(LIPO_STEPS="0"), "steps"),  # parsed, then refused by LipoConfig's bounds
        (dict(LIPO_MODALITIES="cbt,dbt"), "modalities"),  # not a modality of the paper
    ):
        result = manage("check", **env)
        assert result.returncode != 0
        assert name in result.stderr.strip().splitlines()[-1]
