"""The Celery app: JSON only, late acks, one `training` queue with concurrency 1.

Settings live in Django settings under the CELERY_ namespace. The web side queues
training rounds by task *name* and never imports ``training_worker``.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("default"), Queue("training"))
app.autodiscover_tasks()
