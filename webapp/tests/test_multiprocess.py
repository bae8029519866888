"""Past one machine: two ASGI servers and two Celery workers sharing PostgreSQL and Redis.

Everything runs as real processes on loopback (``scripts.cluster``, the Procfile's
command lines) with the tiny in-code model, on the pytest-django test database (hence
``transaction=True``: the servers see only committed rows) and the tests' Redis.

One journey, as a clinic would see it:

1. A client logs in and starts a session through server A, chats, and its socket is cut
   while a reply is being written; it reconnects through server B, resyncs as the page
   does, resends its last message (as a client that never saw it acknowledged would)
   and goes on. The database and the frames' sequence numbers show no turn lost or
   duplicated.
2. A clinician connected to server B receives the crisis alert raised on server A.
3. Ending the session on A queues a LiPO round; the training worker runs it; the
   clinician approves the version on B, and a new session started on A pins it and is
   answered with it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from django.contrib.auth.hashers import Argon2PasswordHasher
from websockets.asyncio.client import ClientConnection, connect

from scripts.cluster import Cluster
from webapp.accounts.models import ClientProfile, User
from webapp.accounts.tests.factories import (
    PASSWORD,
    ClientProfileFactory,
    ClinicianFactory,
    grant_all_consents,
)
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.browser_support import server_env, wait_for_other_db_sessions_to_end
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.learning.tests.helpers import make_evidence
from webapp.oversight.models import SafetyFlag
from webapp.tests.live_http import Web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

WAIT = 240.0  # seconds; a bound against hangs on busy cores, never part of an assertion
CRISIS = "I want to kill myself"
# Small LiPO rounds on the tiny model (the worker reads them from its environment).
LIPO_ENV = {
    "LIPO_SESSIONS_PER_ROUND": "1",
    "LIPO_BATCH_EDGES": "12",
    "LIPO_MIN_GROUPS": "4",
    "LIPO_MODALITIES": "cbt,bt",
    "LIPO_MIN_SHARE": "0.25",
    "LIPO_LORA_RANK": "4",
    "LIPO_LEARNING_RATE": "0.0005",
    "LIPO_STEPS": "2",
    "LIPO_BETA": "0.5",
    "LIPO_MAX_LENGTH": "64",
    "LIPO_SIDE_BY_SIDE_TOKENS": "8",
    "LIPO_ARENA_CLIENTS": "0",  # the simulated-client arena check is tested elsewhere
}
TURN = re.compile(r'<article class="turn turn-(\w+)" id="turn-(\d+)" data-seq="(\d+)"')
ERROR_CODE = re.compile(r'data-code="([a-z_]+)"')


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def cluster(transactional_db, tiny_model_dir, tmp_path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    env = {
        **server_env(str(tiny_model_dir), max_new_tokens=8, candidates=2),
        **LIPO_ENV,
        "PSYEVO_ADAPTER_DIR": str(tmp_path / "adapters"),
        "PSYEVO_BACKEND_TIMEOUT": "120",
    }
    cluster = Cluster(
        asgi=2, workers=("default", "training"), env=env, log_dir=tmp_path / "logs", purge=True
    )
    try:
        with cluster:
            yield cluster
    finally:
        for proc in cluster.procs.values():  # shown when the test fails
            print(f"--- {proc.name} (tail) ---\n{proc.log_tail(2500)}")
        wait_for_other_db_sessions_to_end()


def make_client(clinician: User, modality: str = "cbt") -> User:
    profile = cast(ClientProfile, ClientProfileFactory(clinician=clinician, modality=modality))
    grant_all_consents(profile)
    set_server_password(profile.user)
    return profile.user


def set_server_password(user: User) -> None:
    hasher = Argon2PasswordHasher()  # the servers' first hasher (the tests use MD5)
    user.password = hasher.encode(PASSWORD, hasher.salt())
    user.save(update_fields=["password"])


# -- websockets, as the chat page does it -----------------------------------------------------
@dataclass
class Chat:
    """One client's view of the transcript, built from turn frames by sequence number."""

    seen: dict[int, str] = field(default_factory=dict)  # seq -> role
    repeats: int = 0  # a turn frame received twice (the page dedupes it by id)

    @property
    def last_seq(self) -> int:
        return max(self.seen, default=-1)

    def absorb(self, frame: str) -> None:
        for role, seq, _ in TURN.findall(frame):
            if int(seq) in self.seen:
                self.repeats += 1
            self.seen[int(seq)] = role

    async def open(self, base_ws: str, session_id: int, web: Web) -> ClientConnection:
        ws = await connect(
            f"{base_ws}/ws/sessions/{session_id}/",
            origin=base_ws.replace("ws://", "http://"),  # type: ignore[arg-type]
            additional_headers={"Cookie": web.header},
            open_timeout=60,
        )
        await ws.send(json.dumps({"type": "resync", "after_seq": self.last_seq}))
        return ws

    async def until(self, ws: ClientConnection, done: Callable[[str], bool]) -> str:
        async with asyncio.timeout(WAIT):
            while True:
                frame = str(await ws.recv())
                self.absorb(frame)
                if done(frame):
                    return frame

    def answered(self, client_seq: int) -> bool:
        return any(s > client_seq and r == "counselor" for s, r in self.seen.items())

    async def say(self, ws: ClientConnection, text: str, msg_id: str) -> int:
        """Send a message; returns its client turn's seq once a reply to it is shown.
        "busy" (the server is finishing the previous one) is retried, as a person would."""
        while True:
            await ws.send(json.dumps({"type": "message", "text": text, "client_msg_id": msg_id}))
            frame = await self.until(ws, lambda f: "turn-client" in f or "data-code" in f)
            code = ERROR_CODE.search(frame)
            if code and code.group(1) == "busy":
                await asyncio.sleep(0.5)
                continue
            assert code is None, frame
            seq = max(s for s, r in self.seen.items() if r == "client")
            await self.until(ws, lambda f, seq=seq: self.answered(seq))  # type: ignore[misc]
            return seq


async def chat_across_servers(
    cluster: Cluster, client: Web, clinician: Web, session_id: int
) -> tuple[Chat, list[str]]:
    server_a, server_b = cluster.ws_urls
    chat = Chat()
    alerts = await connect(
        f"{server_b}/ws/notifications/",
        origin=server_b.replace("ws://", "http://"),  # type: ignore[arg-type]
        additional_headers={"Cookie": clinician.header},
        open_timeout=60,
    )
    # 1. On A: one exchange, then a second message whose socket is cut mid-reply.
    ws = await chat.open(server_a, session_id, client)
    await chat.say(ws, "I feel anxious about work", "m1")
    await ws.send(json.dumps({"type": "message", "text": "I cannot sleep", "client_msg_id": "m2"}))
    await chat.until(ws, lambda f: "turn-client" in f)
    cut_at = chat.last_seq
    ws.transport.abort()  # no closing handshake: the network went away
    # 2. On B: resync after the last turn shown, get the reply A finished meanwhile,
    #    resend the unacknowledged message, and go on.
    ws = await chat.open(server_b, session_id, client)
    await chat.until(ws, lambda f: chat.answered(cut_at))
    # The resend of an answered message is stored and answered once (checked in the DB);
    # the server says nothing to it, so the next message follows at once.
    await ws.send(json.dumps({"type": "message", "text": "I cannot sleep", "client_msg_id": "m2"}))
    await chat.say(ws, "My friend has not answered my messages", "m3")
    await ws.close()
    # 3. A crisis through A; the clinician's page on B gets the alert.
    ws = await chat.open(server_a, session_id, client)
    await chat.say(ws, CRISIS, "m4")
    await ws.close()
    frames = []
    async with asyncio.timeout(WAIT):
        while 'data-kind="safety_flag"' not in (frame := str(await alerts.recv())):
            frames.append(frame)
        frames.append(frame)
    await alerts.close()
    return chat, frames


def wait_for(predicate: Callable[[], Any], what: str, cluster: Cluster) -> Any:
    deadline = time.monotonic() + WAIT
    while not (value := predicate()):
        for proc in cluster.procs.values():
            assert proc.alive, f"{proc.name} died before {what}:\n{proc.log_tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return value


# -- the journey ------------------------------------------------------------------------------
def test_it_serves_one_journey_across_two_servers_and_two_workers(cluster: Cluster) -> None:
    server_a, server_b = cluster.urls[0], cluster.urls[1]
    clinician_user = cast(User, ClinicianFactory())
    set_server_password(clinician_user)
    user = make_client(clinician_user)
    make_evidence()  # buffered candidate groups (cbt, bt): the round's batch is admissible

    client, clinician = Web(), Web()
    client.log_in(server_a, user.username, PASSWORD)
    clinician.log_in(server_b, clinician_user.username, PASSWORD)
    chat_url, _ = client.post(f"{server_a}/sessions/start/", {})
    session_id = int(re.search(r"/sessions/(\d+)/", chat_url).group(1))  # type: ignore[union-attr]

    chat, alert_frames = asyncio.run(chat_across_servers(cluster, client, clinician, session_id))

    # No turn lost or duplicated: every message stored once, each answered exactly once,
    # in order, and the client saw exactly the stored sequence numbers.
    turns = list(Turn.objects.filter(session_id=session_id).order_by("seq"))
    assert [t.seq for t in turns] == list(range(len(turns)))
    assert [t.client_msg_id for t in turns if t.role == "client"] == ["m1", "m2", "m3", "m4"]
    assert [t.role for t in turns] == ["client", "counselor"] * 4
    assert chat.seen == {t.seq: t.role for t in turns}
    # The crisis raised on A reached the clinician's page on B.
    flag = SafetyFlag.objects.get(session_id=session_id)
    assert flag.level == "crisis" and flag.turn.client_msg_id == "m4"
    assert f'data-flag="{flag.pk}"' in alert_frames[-1]

    # The session ends on A: a LiPO round is queued and runs on the training worker.
    client.post(f"{server_a}/sessions/{session_id}/end/", {"skip": "on"})
    assert Session.objects.get(pk=session_id).status == "ended"
    run = wait_for(
        lambda: TrainingRun.objects.filter(status__in=["succeeded", "failed"]).first(),
        "the LiPO round",
        cluster,
    )
    assert run.status == "succeeded", run.error
    version = AdapterVersion.objects.get(pk=run.output_version_id)
    assert version.status == "pending_approval", version.validation_report

    # The clinician approves it on B; a new session started on A pins it and is answered.
    clinician.post(f"{server_b}/adapters/{version.pk}/approve/", {"note": "read the report"})
    version.refresh_from_db()
    assert version.status == "active"
    newcomer, other = make_client(clinician_user), Web()
    other.log_in(server_a, newcomer.username, PASSWORD)
    chat_url, _ = other.post(f"{server_a}/sessions/start/", {})
    new_id = int(re.search(r"/sessions/(\d+)/", chat_url).group(1))  # type: ignore[union-attr]
    assert Session.objects.get(pk=new_id).adapter_version_id == version.pk

    async def one_exchange() -> None:
        chat = Chat()
        ws = await chat.open(cluster.ws_urls[0], new_id, other)
        await chat.say(ws, "I feel stuck since the move", "n1")
        await ws.close()

    asyncio.run(one_exchange())
    reply = Turn.objects.get(session_id=new_id, role="counselor")
    group = CandidateGroup.objects.get(turn=reply)
    assert group.adapter_version_id == version.pk  # generated under the approved adapter
