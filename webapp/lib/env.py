"""Typed, loud helpers for reading configuration from the environment.

Every setting comes from here so a bad value fails at start-up with one line that names
the variable, instead of surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import base64
import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str, default: str | None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_str(name: str, default: str | None = None) -> str | None:
    return _raw(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={value!r} must be finite")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}")
    return value


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip()
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name} must be a URL with scheme {' or '.join(schemes)}, got {value!r}"
        )
    return value


def require(name: str) -> str:
    """A variable production cannot start without: stop with one line naming it."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise SystemExit(
            f"ImproperlyConfigured: environment variable {name} is required when DEBUG=false"
        )
    return value


def env_fernet_keys(name: str) -> list[str]:
    """Comma-separated Fernet keys (url-safe base64 of 32 bytes), the first the current one.

    A malformed key stops start-up naming its position, never its value: the message may
    end up in a log.
    """
    keys = env_list(name, [])
    for position, key in enumerate(keys, start=1):
        try:
            raw = base64.urlsafe_b64decode(key.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raw = b""
        if len(raw) != 32:
            raise ImproperlyConfigured(
                f"{name}: key {position} of {len(keys)} is not a Fernet key (url-safe base64 of"
                " 32 bytes; make one with `manage.py rotate_keys --generate`)"
            )
    if len(set(keys)) != len(keys):
        raise ImproperlyConfigured(f"{name} lists the same key twice")
    return keys
