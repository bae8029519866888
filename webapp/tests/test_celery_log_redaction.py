"""A Celery worker's own log handlers redact secrets like the web's (issue 18, item 5).

Celery replaces the root logger's handlers when a worker starts, dropping the filter that
settings.LOGGING put there; this runs Celery's real logging setup and logs a secret."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.utils.log import get_task_logger
from django.conf import settings

from webapp.celery import app
from webapp.lib.logsafety import REDACTED


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    task_logger = get_task_logger("webapp.tests.redaction")
    saved_task = list(task_logger.handlers)
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:
                handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        task_logger.handlers[:] = saved_task
        app.log.already_setup = False


def test_worker_log_handlers_redact_secrets(tmp_path: Path, restored_logging: None) -> None:
    logfile = tmp_path / "worker.log"
    app.log.already_setup = False
    app.log.setup(loglevel="INFO", logfile=str(logfile), redirect_stdouts=False)
    secret = settings.SECRET_KEY
    assert len(secret) >= 8

    logging.getLogger("webapp.anything").warning("connecting with key %s", secret)
    get_task_logger("webapp.tests.redaction").error("task saw %s", secret)
    try:
        raise RuntimeError(f"boom {secret}")
    except RuntimeError:
        logging.getLogger("webapp.anything").exception("failed")
    for handler in logging.getLogger().handlers:
        handler.flush()

    text = logfile.read_text()
    assert "connecting with key" in text and "task saw" in text and "boom" in text
    assert secret not in text
    assert text.count(REDACTED) >= 3
