"""Celery side of test-time learning: LiPO rounds with peft, validation, hand-off to the
clinician approval gate. Imports ``counselor_engine`` and ``webapp``; nothing imports it
except the worker (``celery -A webapp worker -Q training -I training_worker.tasks``) and
the operator command ``manage.py lipo_round --now``."""
