"""The Celery app: JSON only, late acks, one `training` queue with concurrency 1.

Settings live in Django settings under the CELERY_ namespace. The web side queues
training rounds by task *name* and never imports ``training_worker``.

A worker sets up its own log handlers in place of the ones ``settings.LOGGING`` made; the
signal handlers below put the secret-redacting filter (``webapp.lib.logsafety``) on them, so
worker logs are redacted like the web's.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, signals
from kombu import Queue

from webapp.lib.logsafety import install_on

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("default"), Queue("training"))
app.autodiscover_tasks()


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def redact_worker_logs(logger: logging.Logger, *args: Any, **kwargs: Any) -> None:
    install_on(logger)
