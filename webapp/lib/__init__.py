"""Helpers every web app shares (as healthchecks keeps ``hc/lib/``); a plain package, not an app.

Which module of ``webapp`` may import which (no circles, imports inside functions included):

- ``webapp.lib.*`` imports no app module except apps' ``models`` modules.
- ``<app>.models`` import only ``webapp.lib`` and other apps' ``models``.
- Domain modules (everything in an app that is not in the outer ring below) may import
  ``webapp.lib``, any ``models``, and domain modules of apps EARLIER in this order:
  accounts < memory < learning < oversight < counseling (and of their own app).
- Outer ring (transports and presentation: ``views.py``, ``*_views.py``, ``consumers.py``,
  ``urls.py``, ``*_urls.py``, ``admin.py``, ``apps.py``, ``forms.py``, ``templatetags/``,
  ``management/commands/``, ``simlab.py``, ``simreport.py``; simlab is a transport like
  the websocket consumer: it sends messages through ``counseling/turns.py``) may import
  any app's domain modules and ``webapp.lib``, but not another app's outer-ring modules.
  What pages of two apps share (a form, a consent gate) lives in ``webapp.lib``.
- The composition root (``webapp/settings.py``, ``urls.py``, ``asgi.py``, ``routing.py``,
  ``wsgi.py``, ``celery.py``, ``health.py``) may import anything in ``webapp``.
- No module of ``webapp`` imports ``training_worker``: Celery tasks are queued by name, and
  ``manage.py lipo_round --now`` runs the trainer's entry point that settings name.

Within an app, a module that queues a Celery task of its own app whose task module
imports it back queues it by name (``webapp.oversight.alerts``), as for the trainer.
"""
