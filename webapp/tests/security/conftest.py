"""The security suite's one place for logging people in and for the data they probe.

``world`` builds two clients (A and B), each with their own clinician, an admin, and
everything a role might try to reach: A's transcripts, memory, posterior, candidate
graph, a crisis flag, adapter versions (one pending from a round that clinician B
started, whose validation report holds A's words as older rounds wrote them) and an
erasure report; and three more clients of clinician A, each with one consent withdrawn:
C clinician review, D memory, E training.
A's (and C's, D's, E's) texts carry ``CANARY_A`` so a page that should not show them can be checked
for it.

Log-ins live here only (``login``, ``session_cookie``, ``ws_connect``): when MFA
(django-otp) guards staff pages, this is the one place that has to satisfy it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client

from webapp.accounts.models import ClientProfile, ConsentRecord, Role, User
from webapp.accounts.tests.factories import (
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
    UserFactory,
    grant_all_consents,
)
from webapp.asgi import application  # sets Django up (and its logging) before any fixture
from webapp.counseling.models import Session, Turn
from webapp.counseling.tests.helpers import end_refused
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.tests.helpers import make_version, write_adapter_files
from webapp.lib import audit
from webapp.memory.models import MemoryItem
from webapp.oversight.models import AuditEvent, SafetyFlag
from webapp.oversight.tests.helpers import make_session

ROLES = ("anonymous", "client_a", "client_b", "clinician_a", "clinician_b", "admin")
CANARY_A = "canary-7f3a-client-a"
ORIGIN = b"http://localhost"


# -- who is logged in ----------------------------------------------------------------------
def _otp_device_id(user: User) -> str | None:
    """With django-otp's TOTP plugin installed, staff sessions carry a verified device
    (as after a real two-factor log-in); clients have none. None without the plugin."""
    if "django_otp.plugins.otp_totp" not in settings.INSTALLED_APPS or user.role == Role.CLIENT:
        return None
    from django_otp.plugins.otp_totp.models import TOTPDevice

    device = TOTPDevice.objects.filter(user=user, confirmed=True).first()
    device = device or TOTPDevice.objects.create(user=user, name="tests", confirmed=True)
    return str(device.persistent_id)


def _session_store(user: User) -> SessionStore:
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    device_id = _otp_device_id(user)
    if device_id is not None:
        from django_otp import DEVICE_ID_SESSION_KEY

        store[DEVICE_ID_SESSION_KEY] = device_id
    store.save()
    return store


def login(client: Client, user: User | None) -> Client:
    """Log ``user`` into the test client (None: stay anonymous)."""
    if user is not None:
        store = _session_store(user)
        client.cookies[settings.SESSION_COOKIE_NAME] = store.session_key
    return client


def session_cookie(user: User) -> tuple[bytes, str]:
    """A Cookie header value for the websocket handshake, and the Django session key."""
    store = _session_store(user)
    assert store.session_key is not None
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}".encode(), store.session_key


async def ws_connect(
    path: str, user: User | None, *, origin: bytes | None = ORIGIN
) -> tuple[WebsocketCommunicator, bool, int | str | None]:
    """Open a socket as ``user`` (None: anonymous); refused sockets are finished here."""
    headers = [(b"host", b"localhost")]
    if origin is not None:
        headers.append((b"origin", origin))
    if user is not None:
        cookie, _ = await sync_to_async(session_cookie)(user)
        headers.append((b"cookie", cookie))
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect(timeout=10)
    if not connected:
        await end_refused(comm)
    return comm, connected, code


# -- the security log ----------------------------------------------------------------------
class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def security_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the ``psyevo.security`` logger (attached directly: it does not propagate)."""
    logger = logging.getLogger("psyevo.security")
    handler = _Collect()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# -- the data every role probes ------------------------------------------------------------
@dataclass
class World:
    users: dict[str, User | None]
    profile_a: ClientProfile
    profile_b: ClientProfile
    session_a: Session  # ended, with decision, candidate group and posterior update
    open_a: Session  # open: the live chat and takeover target
    session_b: Session
    memory_a: MemoryItem
    memory_b: MemoryItem
    flag_a: SafetyFlag
    pending: AdapterVersion  # from a round clinician B started
    pending_free: AdapterVersion  # from a scheduled round nobody started by hand
    retired: AdapterVersion  # approved earlier: the roll-back target
    active: AdapterVersion
    run: TrainingRun
    erasure: AuditEvent
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def client_a(self) -> User:
        return self.profile_a.user

    @property
    def client_b(self) -> User:
        return self.profile_b.user


def build_world(adapter_dir: Path) -> World:
    clinician_a = ClinicianFactory(username="clinician_a")
    clinician_b = ClinicianFactory(username="clinician_b")
    admin = AdminFactory(username="admin")
    admin.is_superuser = True  # as ``add_user --role admin`` makes them
    admin.save()
    profile_a = ClientProfileFactory(user__username="client_a", clinician=clinician_a)
    profile_b = ClientProfileFactory(user__username="client_b", clinician=clinician_b)
    for profile in (profile_a, profile_b):
        grant_all_consents(profile)
    session_a = make_session(profile_a, client_text=f"I feel anxious {CANARY_A}")
    session_b = make_session(profile_b, client_text="I feel anxious about my exams")
    open_a = make_session(profile_a, open_=True, client_text=f"Still anxious {CANARY_A}")
    memory_a = MemoryItem.objects.create(
        client=profile_a.user, kind="fact", text=f"Has a dog {CANARY_A}", origin="counselor"
    )
    memory_b = MemoryItem.objects.create(
        client=profile_b.user, kind="fact", text="Plays the cello", origin="counselor"
    )
    flag_a = SafetyFlag.objects.create(
        client=profile_a.user,
        session=open_a,
        turn=Turn.objects.filter(session=open_a, role="client").first(),
        level="crisis",
    )
    approver = ClinicianFactory(username="approver")
    active = make_version(
        "v-active", "active", write_adapter_files(adapter_dir / "active"), approver=approver
    )
    retired = make_version(
        "v-retired", "retired", write_adapter_files(adapter_dir / "retired", b"old"),
        approver=approver, parent=None,
    )  # fmt: skip
    # A report written before issue 18 copied a held-out group of A into side_by_side:
    # the approval page, open to all staff, must never show it.
    report = {
        "passed": True,
        "checks": [{"name": "update_norm", "passed": True, "detail": "relative update 0.01"}],
        "side_by_side": [
            {"group": "g-a", "modality": "cbt", "held_out": True,
             "prompt": [{"role": "user", "content": f"I feel anxious {CANARY_A}"}],
             "parent": f"You said {CANARY_A}", "candidate": f"Tell me about {CANARY_A}"},
            {"id": "cbt-work-worry", "source": "project", "modality": "cbt",
             "prompt": [{"role": "user", "content": "I dread Mondays."}],
             "parent": "Tell me more.", "candidate": "What happens on Sundays?"},
        ],
    }  # fmt: skip
    pending = make_version(
        "v-pending", "pending_approval", write_adapter_files(adapter_dir / "pending", b"new"),
        parent=active, validation_report=report,
    )  # fmt: skip
    pending_free = make_version(
        "v-pending-free", "pending_approval", write_adapter_files(adapter_dir / "free", b"n2"),
        parent=active,
    )  # fmt: skip
    run = TrainingRun.objects.create(
        status="succeeded", output_version=pending, parent_version=active,
        started_by=clinician_b, trigger="manual",
    )  # fmt: skip
    TrainingRun.objects.create(
        status="succeeded", output_version=pending_free, parent_version=active
    )
    # Client C, assigned to clinician A, withdrew consent to clinician review: C's
    # transcripts carry CANARY_A too, so a refused page is checked for leaking them.
    profile_c = ClientProfileFactory(user__username="client_c", clinician=clinician_a)
    grant_all_consents(profile_c)
    ConsentRecord.objects.create(profile=profile_c, purpose="clinician_review", granted=False)
    withdrawn_ended = make_session(profile_c, client_text=f"Private {CANARY_A}")
    withdrawn_flagged = make_session(profile_c, client_text=f"I want to end it {CANARY_A}")
    SafetyFlag.objects.create(
        client=profile_c.user, session=withdrawn_flagged, level="crisis",
        turn=Turn.objects.filter(session=withdrawn_flagged, role="client").first(),
    )  # fmt: skip
    withdrawn_open = make_session(profile_c, open_=True, client_text=f"Live {CANARY_A}")
    MemoryItem.objects.create(
        client=profile_c.user, kind="fact", text=f"Remembered {CANARY_A}", origin="client"
    )
    # Client D, assigned to clinician A, withdrew memory consent only: the counselor no
    # longer uses D's memories, but D's clinician (review consent given) still reads them.
    profile_d = ClientProfileFactory(user__username="client_d", clinician=clinician_a)
    grant_all_consents(profile_d)
    ConsentRecord.objects.create(profile=profile_d, purpose="memory", granted=False)
    MemoryItem.objects.create(
        client=profile_d.user, kind="fact", text=f"Kept, unused {CANARY_A}", origin="counselor"
    )
    # Client E, assigned to clinician A, withdrew training consent only: E's own clinician
    # still reviews E's sessions (candidates included), but a validation report that a
    # round wrote from E's held-out evidence shows E's words to no staff member.
    profile_e = ClientProfileFactory(user__username="client_e", clinician=clinician_a)
    grant_all_consents(profile_e)
    ConsentRecord.objects.create(profile=profile_e, purpose="training", granted=False)
    training_withdrawn = make_session(profile_e, client_text=f"Not for training {CANARY_A}")
    report_e = {
        "passed": True,
        "checks": [],
        "side_by_side": [
            {"group": "g-e", "modality": "cbt", "held_out": True,
             "prompt": [{"role": "user", "content": f"Not for training {CANARY_A}"}],
             "parent": f"You said {CANARY_A}", "candidate": f"Go on about {CANARY_A}"},
        ],
    }  # fmt: skip
    report_of_withdrawn = make_version(
        "v-report-e", "rejected", write_adapter_files(adapter_dir / "report-e", b"e"),
        parent=active, validation_report=report_e,
    )  # fmt: skip
    # An erasure report of some other, already erased client.
    gone = UserFactory(username="erased")
    erasure = audit.record(admin, "client.erase", target=f"user:{gone.pk}", counts={})
    return World(
        users={
            "anonymous": None,
            "client_a": profile_a.user,
            "client_b": profile_b.user,
            "clinician_a": clinician_a,
            "clinician_b": clinician_b,
            "admin": admin,
        },
        profile_a=profile_a,
        profile_b=profile_b,
        session_a=session_a,
        open_a=open_a,
        session_b=session_b,
        memory_a=memory_a,
        memory_b=memory_b,
        flag_a=flag_a,
        pending=pending,
        pending_free=pending_free,
        retired=retired,
        active=active,
        run=run,
        erasure=erasure,
        extra={
            "withdrawn_ended": withdrawn_ended,
            "withdrawn_flagged": withdrawn_flagged,
            "withdrawn_open": withdrawn_open,
            "memory_withdrawn": profile_d.user,
            "training_withdrawn": training_withdrawn,
            "report_of_withdrawn": report_of_withdrawn,
        },
    )


@pytest.fixture
def adapter_dir(settings: Any, tmp_path: Path) -> Path:
    """Adapter files in a temporary folder; staff need two-factor log-in, as in production."""
    settings.ADAPTER_DIR = tmp_path / "adapters"
    if hasattr(settings, "PSYEVO_REQUIRE_MFA"):
        settings.PSYEVO_REQUIRE_MFA = True
    return tmp_path / "adapter-files"


@pytest.fixture
def world(db: Any, adapter_dir: Path) -> World:
    return build_world(adapter_dir)
