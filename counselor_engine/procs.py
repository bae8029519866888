"""Process liveness: the one helper the web side, the service scripts and the vLLM
supervisor share.

It lives in the engine because importing ``counselor_engine`` costs nothing (its
``__init__`` is a docstring; no Django, no Celery), so every process can load it: the web
app (which may not import ``scripts``, an uninstalled folder) and ``bin/vllm``'s supervisor
(which runs from ``.venv-vllm``, standard library only, and may not import ``webapp``,
whose package import starts Celery). Standard library only.
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without signalling).

    A process owned by another user answers ``PermissionError``: it exists, so True.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
