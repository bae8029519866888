"""The web process's model in its own child process (the default): a session is answered
through it, and when the child dies the client keeps the message, gets a retry, and the
retry is answered by a fresh child."""

from __future__ import annotations

import json
import os
import signal

import pytest
from asgiref.sync import sync_to_async

from counselor_engine.backends.process_backend import ProcessBackend
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import runtime, services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
DONE = r'class="turn turn-counselor"'


@pytest.fixture
def process_engine(tiny_engine, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_MODEL_PROCESS = True
    settings.PSYEVO_MODEL_NICE = 0
    runtime.reset_backend()
    yield
    runtime.reset_backend()


def _client():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


async def test_a_session_is_answered_through_the_model_process_and_survives_its_death(
    process_engine,
):  # type: ignore[no-untyped-def]
    profile, session = await sync_to_async(_client)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await comm.send_to(text_data=json.dumps(
        {"type": "message", "text": "work is hard lately", "client_msg_id": "p1"}
    ))  # fmt: skip
    await frames_until(comm, DONE, wait=120)
    backend = await runtime.get_backend().get()
    assert isinstance(backend, ProcessBackend)
    pid = backend.pid
    assert pid is not None and pid != os.getpid()

    os.kill(pid, signal.SIGKILL)
    await comm.send_to(text_data=json.dumps(
        {"type": "message", "text": "and I sleep badly", "client_msg_id": "p2"}
    ))  # fmt: skip
    # Either the dead child is noticed at once (an error frame with a retry) or the call
    # already went to a fresh child; both keep the message and answer it exactly once.
    frames = await frames_until(comm, rf"{DONE}|data-code=\"backend_error\"", wait=120)
    if 'data-code="backend_error"' in frames[-1]:
        assert 'name="type" value="retry"' in frames[-1]
        await comm.send_to(text_data=json.dumps({"type": "retry", "client_msg_id": "p2"}))
        await frames_until(comm, DONE, wait=120)
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["client", "counselor", "client", "counselor"]
    assert backend.pid not in (None, pid)
    await comm.disconnect()


async def test_a_crisis_after_the_model_process_died_gets_the_safe_reply_at_once(
    process_engine,
):  # type: ignore[no-untyped-def]
    import time

    from webapp.oversight.models import SafetyFlag

    profile, session = await sync_to_async(_client)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    await comm.send_to(text_data=json.dumps(
        {"type": "message", "text": "work is hard lately", "client_msg_id": "p1"}
    ))  # fmt: skip
    await frames_until(comm, DONE, wait=120)
    backend = await runtime.get_backend().get()
    assert isinstance(backend, ProcessBackend) and backend.pid is not None
    os.kill(backend.pid, signal.SIGKILL)

    started = time.monotonic()
    await comm.send_to(text_data=json.dumps(
        {"type": "message", "text": "I want to kill myself tonight", "client_msg_id": "p2"}
    ))  # fmt: skip
    frames = await frames_until(comm, DONE, wait=10)
    assert time.monotonic() - started < 2.0
    assert "988" in frames[-1]
    flag = await sync_to_async(SafetyFlag.objects.get)(session=session)
    assert flag.level == "crisis"
    await comm.disconnect()
