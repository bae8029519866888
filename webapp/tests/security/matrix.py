"""The authorization matrix as data: who may reach what, over which transport.

Written from the product rules (README "What each role can do", docs/architecture.md "Who uses it"),
not read off the code, so the tests check the code against the rules:

- A client reaches their own transcripts, memory, data export and chat socket, nothing
  of another client's, and no staff page. A client never approves anything.
- A clinician reaches only the clients assigned to them: transcripts, the session review
  (skill, candidates, preference graph), memory review and correction, skill controls,
  alerts, joining a live session and pausing the AI (takeover). Clinicians decide on
  adapter versions; whoever started a round cannot approve its output.
- Consent is checked where the data is used: while a client has withdrawn consent to
  clinician review, their clinician gets no transcript review and no live page, except
  that a session with a safety flag shows the flagged turn; no staff socket joins their
  sessions. Memory consent decides what the counselor uses, training consent what
  trains the shared counselor: neither hides a client's data from their own clinician.
  The approval page is open to all staff, so it shows no client's words, even from a
  report that holds them (also one built from a training-withdrawn client's evidence).
- An admin has the console (posteriors, population, runs, lineage, audit log and its
  export, erasure), the Django admin for accounts, may roll back to an earlier approved
  version, and reads no transcript, memory or candidate graph. The Django admin never
  approves or activates a version and never erases a client (the console's erasure
  writes the report).

Roles: ``client_a`` owns the probed data; ``clinician_a`` is assigned to A;
``clinician_b`` is assigned to client B only (so unassigned for A) and started the round
whose output is ``pending``; ``admin`` is an admin. Each row is one endpoint; the roles
not in ``allowed`` must be refused: HTTP 403/404 (anonymous: the log-in redirect) with a
``psyevo.security`` log line; a socket refused before accept with a 44xx code and a log
line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webapp.tests.security.conftest import CANARY_A, ROLES, World

RESOURCES = (
    "transcript",
    "memory",
    "posterior",
    "candidate_graph",
    "adapter_approve",
    "adapter_activate",
    "adapter_rollback",
    "audit_log",
    "export",
    "erasure",
    "takeover",
)
TRANSPORTS = ("http", "websocket", "admin")

CLIENT_A = frozenset({"client_a"})
CLINICIAN_A = frozenset({"clinician_a"})
ADMIN = frozenset({"admin"})
CLIENTS = frozenset({"client_a", "client_b"})
CLINICIANS = frozenset({"clinician_a", "clinician_b"})
STAFF = CLINICIANS | ADMIN
NOBODY: frozenset[str] = frozenset()
LOGGED_IN = frozenset(ROLES) - {"anonymous"}


@dataclass(frozen=True)
class Row:
    """One endpoint and the roles the product rules allow there."""

    resource: str
    transport: str
    name: str
    method: str  # "get" | "post" | "ws"
    path: Callable[[World], str]
    allowed: frozenset[str]
    data: Callable[[World], dict[str, Any]] = field(default=lambda w: {})
    # For an allowed POST: the change it must have made (checked after the request).
    effect: Callable[[World], bool] | None = None
    # Roles whose allowed answer must show A's data (CANARY_A); every other allowed
    # role's answer must not. None: the page shows no client text either way.
    sees_a: frozenset[str] | None = None
    # Allowed roles not probed here, with the test that covers them instead.
    elsewhere: dict[str, str] = field(default_factory=dict)


def _a(w: World) -> int:
    return w.client_a.pk


def _status(version_attr: str, status: str) -> Callable[[World], bool]:
    def check(w: World) -> bool:
        version = getattr(w, version_attr)
        version.refresh_from_db()
        return bool(version.status == status)

    return check


def _superseded(w: World) -> bool:
    from webapp.memory.models import MemoryItem

    return MemoryItem.objects.filter(supersedes=w.memory_a).exists()


def _retired_item(w: World) -> bool:
    w.memory_a.refresh_from_db()
    return w.memory_a.retired_at is not None


def _paused(flag: bool) -> Callable[[World], bool]:
    def check(w: World) -> bool:
        from webapp.oversight.models import ClientControl

        control = ClientControl.objects.filter(client=w.client_a).first()
        return control is not None and control.ai_paused is flag

    return check


def _acknowledged(w: World) -> bool:
    w.flag_a.refresh_from_db()
    return w.flag_a.acknowledged_at is not None


def _erased(w: World) -> bool:
    from webapp.oversight.models import AuditEvent

    return AuditEvent.objects.filter(action="client.erase", target=f"user:{_a(w)}").exists()


CELL = "?slot=formulation/early/anxiety&skill="

HTTP: list[Row] = [
    # -- transcript --------------------------------------------------------------------
    Row("transcript", "http", "client transcript page", "get",
        lambda w: f"/sessions/{w.session_a.pk}/transcript/", CLIENT_A, sees_a=CLIENT_A),
    Row("transcript", "http", "client chat page", "get",
        lambda w: f"/sessions/{w.open_a.pk}/", CLIENT_A, sees_a=CLIENT_A),
    Row("transcript", "http", "end another's session", "post",
        lambda w: f"/sessions/{w.open_a.pk}/end/", CLIENT_A, data=lambda w: {"skip": "on"},
        elsewhere={"client_a": "counseling/tests/test_session_flow.py (needs the model)"}),
    Row("transcript", "http", "clinician live session", "get",
        lambda w: f"/clinician/sessions/{w.open_a.pk}/", CLINICIAN_A, sees_a=CLINICIAN_A),
    Row("transcript", "http", "clinician client page", "get",
        lambda w: f"/clinician/clients/{_a(w)}/", CLINICIAN_A),
    # Client C (clinician A's) withdrew clinician review: refused even to clinician A...
    Row("transcript", "http", "session review, review consent withdrawn", "get",
        lambda w: f"/clinician/sessions/{w.extra['withdrawn_ended'].pk}/review/", NOBODY),
    Row("transcript", "http", "live session, review consent withdrawn", "get",
        lambda w: f"/clinician/sessions/{w.extra['withdrawn_open'].pk}/", NOBODY),
    Row("memory", "http", "clinician memory review, review consent withdrawn", "get",
        lambda w: f"/clinician/clients/{w.extra['withdrawn_ended'].client_id}/memory/", NOBODY),
    # Memory consent governs what the counselor uses, not what the client's clinician may
    # read (that is review consent): D's memories stay on D's clinician's page.
    Row("memory", "http", "clinician memory review, memory consent withdrawn", "get",
        lambda w: f"/clinician/clients/{w.extra['memory_withdrawn'].pk}/memory/", CLINICIAN_A,
        sees_a=CLINICIAN_A),
    # Training consent governs the shared counselor's training, not clinician review: E's
    # clinician still sees E's candidates; no staff member sees E's words in a report.
    Row("candidate_graph", "http", "session review, training consent withdrawn", "get",
        lambda w: f"/clinician/sessions/{w.extra['training_withdrawn'].pk}/review/",
        CLINICIAN_A, sees_a=CLINICIAN_A),
    Row("adapter_approve", "http", "version report from evidence of a training-withdrawn client",
        "get", lambda w: f"/adapters/{w.extra['report_of_withdrawn'].pk}/", STAFF,
        sees_a=NOBODY),
    # ...except the flagged turn of a session with a safety flag.
    Row("transcript", "http", "flagged turn, review consent withdrawn", "get",
        lambda w: f"/clinician/sessions/{w.extra['withdrawn_flagged'].pk}/review/",
        CLINICIAN_A, sees_a=CLINICIAN_A),
    # -- memory ------------------------------------------------------------------------
    Row("memory", "http", "my memory (own only)", "get", lambda w: "/memory/", CLIENTS,
        sees_a=CLIENT_A),
    Row("memory", "http", "client corrects a memory", "post",
        lambda w: f"/memory/{w.memory_a.pk}/correct/", CLIENT_A,
        data=lambda w: {"text": "Has a cat"}, effect=_superseded),
    Row("memory", "http", "clinician memory review", "get",
        lambda w: f"/clinician/clients/{_a(w)}/memory/", CLINICIAN_A, sees_a=CLINICIAN_A),
    Row("memory", "http", "clinician corrects a memory", "post",
        lambda w: f"/clinician/clients/{_a(w)}/memory/{w.memory_a.pk}/correct/", CLINICIAN_A,
        data=lambda w: {"text": "Has a cat"}, effect=_superseded),
    Row("memory", "http", "clinician retires a memory", "post",
        lambda w: f"/clinician/clients/{_a(w)}/memory/{w.memory_a.pk}/retire/", CLINICIAN_A,
        effect=_retired_item),
    # An id-swap probe: B's path (which clinician B may use) with A's memory item.
    Row("memory", "http", "A's memory through B's page", "post",
        lambda w: f"/clinician/clients/{w.client_b.pk}/memory/{w.memory_a.pk}/correct/",
        NOBODY, data=lambda w: {"text": "Has a cat"}),
    # -- posterior ---------------------------------------------------------------------
    Row("posterior", "http", "posterior inspector", "get",
        lambda w: f"/console/clients/{_a(w)}/posteriors/", ADMIN),
    Row("posterior", "http", "posterior cell history", "get",
        lambda w: f"/console/clients/{_a(w)}/posteriors/cell/{CELL}CBT1", ADMIN),
    Row("posterior", "http", "population view", "get", lambda w: "/console/population/",
        ADMIN),
    Row("posterior", "http", "skill controls", "get",
        lambda w: f"/clinician/clients/{_a(w)}/skills/", CLINICIAN_A),
    # -- candidate graph ---------------------------------------------------------------
    Row("candidate_graph", "http", "session review", "get",
        lambda w: f"/clinician/sessions/{w.session_a.pk}/review/", CLINICIAN_A,
        sees_a=CLINICIAN_A),
    # -- adapters ----------------------------------------------------------------------
    Row("adapter_approve", "http", "approval gate list", "get", lambda w: "/adapters/", STAFF),
    # v-pending's report holds A's words (as rounds before issue 18 wrote them): no staff
    # member sees them, A's own clinician included.
    Row("adapter_approve", "http", "version report holding A's words", "get",
        lambda w: f"/adapters/{w.pending.pk}/", STAFF, sees_a=NOBODY),
    Row("adapter_approve", "http", "approve a round clinician B started", "post",
        lambda w: f"/adapters/{w.pending.pk}/approve/", CLINICIAN_A,
        effect=_status("pending", "active")),
    Row("adapter_approve", "http", "approve a scheduled round", "post",
        lambda w: f"/adapters/{w.pending_free.pk}/approve/", CLINICIANS,
        effect=_status("pending_free", "active")),
    Row("adapter_approve", "http", "reject", "post",
        lambda w: f"/adapters/{w.pending.pk}/reject/", CLINICIANS,
        data=lambda w: {"reason": "replies got colder"}, effect=_status("pending", "rejected")),
    Row("adapter_rollback", "http", "roll back", "post",
        lambda w: f"/adapters/{w.retired.pk}/rollback/", STAFF,
        data=lambda w: {"reason": "regression"}, effect=_status("retired", "active")),
    # -- audit log ---------------------------------------------------------------------
    Row("audit_log", "http", "audit log", "get", lambda w: "/console/audit/", ADMIN),
    Row("audit_log", "http", "audit CSV export", "get", lambda w: "/console/audit.csv", ADMIN),
    # -- export ------------------------------------------------------------------------
    Row("export", "http", "my data page", "get", lambda w: "/me/data/", CLIENTS),
    Row("export", "http", "my data download (own only)", "get",
        lambda w: "/me/data/download.json", CLIENTS, sees_a=CLIENT_A),
    # -- erasure -----------------------------------------------------------------------
    Row("erasure", "http", "erasure preview", "get",
        lambda w: f"/console/clients/{_a(w)}/erase/", ADMIN),
    Row("erasure", "http", "erase", "post", lambda w: f"/console/clients/{_a(w)}/erase/",
        ADMIN, data=lambda w: {"confirm": "client_a"}, effect=_erased),
    Row("erasure", "http", "erasure report", "get",
        lambda w: f"/console/erasures/{w.erasure.pk}/", ADMIN),
    # -- takeover ----------------------------------------------------------------------
    Row("takeover", "http", "pause the AI", "post",
        lambda w: f"/clinician/clients/{_a(w)}/pause/", CLINICIAN_A, effect=_paused(True)),
    Row("takeover", "http", "resume the AI", "post",
        lambda w: f"/clinician/clients/{_a(w)}/resume/", CLINICIAN_A, effect=_paused(False)),
    Row("takeover", "http", "acknowledge a crisis flag", "post",
        lambda w: f"/clinician/flags/{w.flag_a.pk}/acknowledge/", CLINICIAN_A,
        effect=_acknowledged),
]  # fmt: skip

WEBSOCKET: list[Row] = [
    Row("transcript", "websocket", "chat socket of A's open session", "ws",
        lambda w: f"/ws/sessions/{w.open_a.pk}/", CLIENT_A | CLINICIAN_A),
    Row("transcript", "websocket", "chat socket of a missing session", "ws",
        lambda w: "/ws/sessions/987654321/", NOBODY),
    # Joining as staff is the takeover (visible to the client, audited); the client's own
    # socket is the transcript row above.
    Row("takeover", "websocket", "clinician joins A's session", "ws",
        lambda w: f"/ws/sessions/{w.open_a.pk}/", CLINICIAN_A,
        elsewhere={"client_a": "the transcript row (the client's own socket)"}),
    # C withdrew clinician review: no staff socket, C's own clinician's included.
    Row("takeover", "websocket", "clinician joins a session, review consent withdrawn", "ws",
        lambda w: f"/ws/sessions/{w.extra['withdrawn_open'].pk}/", NOBODY),
]  # fmt: skip


def _admin_change(w: World) -> dict[str, Any]:
    return {"status": "active", "name": w.pending_free.name}


ADMIN_SITE: list[Row] = [
    Row("transcript", "admin", "no transcripts in the admin", "get",
        lambda w: "/admin/counseling/turn/", NOBODY),
    Row("memory", "admin", "no memory in the admin", "get",
        lambda w: "/admin/memory/memoryitem/", NOBODY),
    Row("posterior", "admin", "no posteriors in the admin", "get",
        lambda w: "/admin/learning/posteriorcell/", NOBODY),
    Row("candidate_graph", "admin", "no candidate groups in the admin", "get",
        lambda w: "/admin/learning/candidategroup/", NOBODY),
    Row("adapter_approve", "admin", "adapter versions, read only", "get",
        lambda w: "/admin/learning/adapterversion/", ADMIN),
    Row("adapter_activate", "admin", "activate a version through the admin", "post",
        lambda w: f"/admin/learning/adapterversion/{w.pending_free.pk}/change/", NOBODY,
        data=_admin_change),
    Row("adapter_rollback", "admin", "re-activate a retired version in the admin", "post",
        lambda w: f"/admin/learning/adapterversion/{w.retired.pk}/change/", NOBODY,
        data=lambda w: {"status": "active", "name": w.retired.name}),
    Row("audit_log", "admin", "no audit events in the admin", "get",
        lambda w: "/admin/oversight/auditevent/", NOBODY),
    Row("erasure", "admin", "deleting a client in the admin", "post",
        lambda w: f"/admin/accounts/user/{_a(w)}/delete/", NOBODY,
        data=lambda w: {"post": "yes"}),
    Row("takeover", "admin", "no client controls in the admin", "get",
        lambda w: "/admin/oversight/clientcontrol/", NOBODY),
    # Account management is what the admin is for.
    Row("accounts", "admin", "admin index", "get", lambda w: "/admin/", ADMIN),
    Row("accounts", "admin", "user list", "get", lambda w: "/admin/accounts/user/", ADMIN),
    Row("accounts", "admin", "client profile", "get",
        lambda w: f"/admin/accounts/clientprofile/{w.profile_a.pk}/change/", ADMIN),
]  # fmt: skip

ROWS = HTTP + WEBSOCKET + ADMIN_SITE

# Cells of RESOURCES x TRANSPORTS with no endpoint at all, and why (kept honest by a test).
NOT_APPLICABLE = {
    ("memory", "websocket"): "memory is never sent over a socket",
    ("posterior", "websocket"): "posteriors are never sent over a socket",
    ("candidate_graph", "websocket"): "candidates stay server-side; the socket sends the reply",
    ("adapter_approve", "websocket"): "decisions are HTTP POSTs only",
    ("adapter_activate", "websocket"): "decisions are HTTP POSTs only",
    ("adapter_rollback", "websocket"): "decisions are HTTP POSTs only",
    ("audit_log", "websocket"): "no socket carries the audit log",
    ("export", "websocket"): "the export is an HTTP download",
    ("erasure", "websocket"): "erasure is an HTTP POST",
    ("adapter_activate", "http"): "approving activates (adapter_approve rows); no other path",
    ("export", "admin"): "the export is the client's own download",
}

# Every HTTP URL pattern is in ROWS, in CRAWL_ONLY (checked by the crawl test) or public.
PUBLIC = {"healthz", "login", "logout", "home", "mfa_setup", "mfa_verify"}
CRAWL_ONLY = {
    "my_sessions", "start_session", "consent", "clinician_home", "admin_home",
    "console_clients", "console_runs", "console_run", "console_lineage",
    "learning:simulations", "learning:simulation",  # the simulation lab (no client data)
}  # fmt: skip


def canary_ok(row: Row, role: str, body: str) -> bool:
    """Whether an allowed answer shows A's data exactly when the rules say so."""
    if row.sees_a is None:
        return True
    return (CANARY_A in body) is (role in row.sees_a)
