"""A crisis message gets the safe reply and is flagged with each dependency stopped.

Issue 9, item 6: "the safe reply within 2 s with the model, Celery and Redis each stopped".
Each test sends a crisis message over the real websocket (PostgreSQL, Channels) and checks
what the client and the clinician would check: the safe reply (with the hotline) arrives,
the ``SafetyFlag`` is stored, and for a crisis the email outbox row exists. The 2 s bound is
the issue's requirement and is asserted as such (measured from sending the message to the
stored reply's frame); everything else is behaviour.

- Model down: the ``broken_engine`` fixture (no model can load). The message is one only
  the learned layer catches, which shows that layer needs no model backend either.
- Celery down: no worker runs (the tests never start one), so the alert email waits in the
  outbox and its delivery task waits in the broker queue; the reply does not wait for it.
- Redis down: a PRIVATE redis-server on a free port carries the channel layer, the cache,
  the reply lock and the Celery broker for this test; it is killed after the socket
  connected (the machine's shared Redis is never touched).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from asgiref.sync import sync_to_async

from counselor_engine import safety
from counselor_engine.safety import registry
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import services
from webapp.counseling.tests.helpers import connect, frames_until, turn_texts
from webapp.oversight.models import AlertOutbox, SafetyFlag

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_db_connections"),
]
DONE = r'class="turn turn-counselor"'
EXPLICIT = "I want to kill myself tonight"
# Missed by the rules, caught by the crisis model (it is in the model's training rounds).
INDIRECT = "i've worked out which pills and how many"
BOUND_S = 2.0


@pytest.fixture(scope="module", autouse=True)
def _crisis_model_loaded() -> None:
    """A server loads the crisis model when the consumer module is imported; do the same
    here so a test measures a message, not the one-off model load."""
    registry.reset()
    registry.warm()
    assert registry.get_model() is not None


def _client():  # type: ignore[no-untyped-def]
    profile = ClientProfileFactory()
    grant_all_consents(profile)
    return profile, services.start_session(profile.user)


async def _crisis_round_trip(text: str):  # type: ignore[no-untyped-def]
    """Send ``text`` as a client; return (profile, session, counselor texts, seconds)."""
    profile, session = await sync_to_async(_client)()
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", profile.user)
    assert connected
    return profile, session, comm


async def _send_and_wait(comm, text: str) -> tuple[list[str], float]:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    await comm.send_to(text_data=json.dumps({"type": "message", "text": text,
                                             "client_msg_id": "m1"}))  # fmt: skip
    frames = await frames_until(comm, DONE, wait=20)
    return turn_texts(frames, "counselor"), time.monotonic() - started


async def _assert_flagged(session, *, model_rule: bool) -> None:  # type: ignore[no-untyped-def]
    # The flag is written beside the reply (consumers._flag_beside_reply): wait for it.
    for _ in range(200):
        flag = await sync_to_async(SafetyFlag.objects.filter(session=session).first)()
        if flag is not None and await sync_to_async(flag.outbox.exists)():
            break
        await asyncio.sleep(0.05)
    assert flag is not None, "no safety flag stored"
    assert flag.level == "crisis"
    assert ("model.crisis" in flag.matched) is model_rule
    assert await sync_to_async(AlertOutbox.objects.filter(flag=flag).exists)()


async def test_it_answers_a_crisis_the_rules_miss_with_the_model_backend_down(
    broken_engine,
):  # type: ignore[no-untyped-def]
    assert safety.rules_assess(INDIRECT).level == "none"
    _, session, comm = await _crisis_round_trip(INDIRECT)
    replies, seconds = await _send_and_wait(comm, INDIRECT)
    assert "988" in replies[0]
    assert seconds < BOUND_S
    await _assert_flagged(session, model_rule=True)
    await comm.disconnect()


async def test_it_answers_a_crisis_and_keeps_the_alert_with_no_celery_worker(tiny_engine, settings):  # type: ignore[no-untyped-def]
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queued_before = broker.llen("default")
    _, session, comm = await _crisis_round_trip(EXPLICIT)
    replies, seconds = await _send_and_wait(comm, EXPLICIT)
    assert "988" in replies[0]
    assert seconds < BOUND_S
    await _assert_flagged(session, model_rule=False)
    outbox = await sync_to_async(AlertOutbox.objects.get)(flag__session=session)
    assert outbox.status == AlertOutbox.Status.PENDING  # waits for a worker, not lost
    # The delivery task is queued after the safe reply has gone out (the turn API runs the
    # flag's notifications last): it waits in the queue, for a worker that never comes.
    for _ in range(100):
        if broker.llen("default") > queued_before:
            break
        await asyncio.sleep(0.05)
    assert broker.llen("default") > queued_before
    await comm.disconnect()


# -- Redis stopped ------------------------------------------------------------------------


# ``private_redis`` / ``on_private_redis``: the root conftest.


async def test_it_answers_a_crisis_and_stores_the_flag_with_redis_stopped(
    tiny_engine, on_private_redis
):  # type: ignore[no-untyped-def]
    _, session, comm = await _crisis_round_trip(EXPLICIT)
    on_private_redis.kill()  # Redis dies under an open socket
    await asyncio.to_thread(on_private_redis.wait, 10)
    replies, seconds = await _send_and_wait(comm, EXPLICIT)
    assert "988" in replies[0]
    assert seconds < BOUND_S
    await _assert_flagged(session, model_rule=False)
    await comm.disconnect()
