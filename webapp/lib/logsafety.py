"""A logging filter that blanks out known secret values before a record is written.

The code never logs secrets on purpose (webapp/tests/test_logging_secrets.py checks the
flows that handle them); this filter is the second line: a setting echoed by a library, a
connection URL in an error message, a key pasted into an exception all come out redacted.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

REDACTED = "[redacted]"
# Shorter values would blank out ordinary words (a test password such as "x").
_MIN_SECRET_LENGTH = 8


def _url_password(url: str) -> str:
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


def known_secrets() -> list[str]:
    """The secret values this process holds, longest first (so no secret is half-masked)."""
    from django.conf import settings

    if not settings.configured:
        return []
    values = [
        getattr(settings, "SECRET_KEY", ""),
        *getattr(settings, "SECRET_KEY_FALLBACKS", []),
        *getattr(settings, "PSYEVO_ENCRYPTION_KEYS", []),
        getattr(settings, "EMAIL_HOST_PASSWORD", ""),
        *(db.get("PASSWORD") or "" for db in getattr(settings, "DATABASES", {}).values()),
        _url_password(getattr(settings, "REDIS_URL", "")),
        _url_password(getattr(settings, "CELERY_BROKER_URL", "") or ""),
    ]
    unique = {str(v) for v in values if v and len(str(v)) >= _MIN_SECRET_LENGTH}
    return sorted(unique, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


class RedactSecretsFilter(logging.Filter):
    """Rewrites a record whose message or traceback contains a known secret; never drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = known_secrets()
        if not secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the formatter's problem, not ours
            return True
        clean = redact(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, secrets)
        return True


def install_on(logger: logging.Logger) -> None:
    """Add the filter to every handler of ``logger`` that lacks it. A Celery worker
    replaces the root logger's handlers with its own (``worker_hijack_root_logger``), so
    the ones from ``settings.LOGGING`` and their filter are gone; ``webapp.celery`` calls
    this on the handlers Celery installs."""
    for handler in logger.handlers:
        if not any(isinstance(f, RedactSecretsFilter) for f in handler.filters):
            handler.addFilter(RedactSecretsFilter())
