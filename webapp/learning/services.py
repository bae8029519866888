"""The approval gate for adapter versions: approve, reject, activate, roll back, serve.

Every state change that can race runs in one transaction that first locks the shared
``LearningScope`` row, so activations are serialised; the status moves themselves are
conditional UPDATEs whose row counts are checked, and the database constraints
(``one_active_adapter``, ``servable_adapter_is_approved``, ``approval_matches_files``)
back them up whatever code path writes.

Lifecycle (docs/architecture.md): training -> validating -> pending_approval -> approved -> active ->
retired, or failed / rejected / superseded. Here, approving a pending version activates it
in the same transaction ("Approve and activate"): it serves sessions that START afterwards,
while a session in progress keeps the version it pinned. Rollback re-activates an earlier
approved (now retired) version.

A version is approvable only while its parent is the active version: a round trains an
update ON TOP of its parent, so approving a sibling (or anything trained from an older
parent) would replace the active update instead of adding to it. Whenever the active
version changes, every pending version trained from another parent is marked
``superseded`` with the reason, its reserved evidence goes back to the buffer, and a new
round is queued (it trains from the version active when it starts) if the buffer holds an
admissible batch. ``approve`` re-checks the parent under the scope lock, for versions that
reached the gate after the change.

The files are bound to the approval by a digest (:func:`adapter_digest`); the serving
side loads a version only through :func:`servable_path`, which recomputes it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from counselor_engine.backends.adapter_files import (
    AdapterRefused,
    files_digest,
    read_adapter_files,
)
from counselor_engine.procs import pid_alive
from webapp.accounts.models import Role, User
from webapp.counseling.models import Session
from webapp.learning import schedule
from webapp.learning.models import AdapterVersion, CandidateGroup, TrainingRun
from webapp.lib import audit

log = logging.getLogger(__name__)

Status = AdapterVersion.Status
SERVABLE = (Status.APPROVED, Status.ACTIVE, Status.RETIRED)
UNLOAD_WINDOW = timedelta(days=7)  # longer than any session: older retirees are unloaded


class GateError(Exception):
    """A gate action was refused; the message is safe to show to staff."""


class DecisionRefused(GateError):
    """Wrong role, the round's own operator, wrong status, or a missing reason."""


class NotServable(GateError):
    """The version was never approved (or failed / was rejected): it must not be loaded."""


class SupersededVersion(DecisionRefused):
    """The version's parent is no longer active: it was marked superseded instead."""


class TamperedAdapter(NotServable):
    """The adapter files on disk no longer match the approved digest."""


# -- files ------------------------------------------------------------------------------


def read_adapter(directory: Path | str) -> dict[str, bytes]:
    """Every regular file of an adapter folder, read once: relative path -> bytes.
    Symlinks are refused: they could point the loader anywhere."""
    try:
        return read_adapter_files(directory)
    except AdapterRefused as exc:
        raise TamperedAdapter(str(exc)) from exc


def adapter_digest(directory: Path | str) -> str:
    """The digest (:func:`files_digest`) of the files in an adapter folder."""
    return files_digest(read_adapter(directory))


def _verified_files(version: AdapterVersion, expected: str) -> dict[str, bytes]:
    if not version.path:
        raise NotServable(f"{version.name} has no files")
    files = read_adapter(version.path)
    actual = files_digest(files)
    if actual != expected:
        raise TamperedAdapter(
            f"{version.name}: files in {version.path} do not match the recorded sha256 "
            f"(expected {expected[:12]}…, found {actual[:12]}…)"
        )
    return files


def _files_match(version: AdapterVersion, expected: str) -> str:
    _verified_files(version, expected)
    return expected


# -- serving ----------------------------------------------------------------------------


def active_version() -> AdapterVersion | None:
    """The version a session starting now must pin (None: the base model)."""
    return AdapterVersion.objects.filter(status=Status.ACTIVE).first()


def servable_path(version: AdapterVersion, *, shared: bool = False) -> Path:
    """A folder to load ``version`` from, holding exactly the bytes that were verified.

    Approved, active and retired versions are servable (a session pinned to a version
    that was retired meanwhile keeps it to the end). The files are read once, their
    digest is compared with ``approved_sha256`` (a mismatch raises
    :class:`TamperedAdapter`), and those same bytes are written into the version's
    snapshot folder, which is returned. Hashing the folder and letting the loader read
    it again afterwards would serve a file swapped in between (issue 18). A folder and
    not bytes, because the backends load by path.

    Where the snapshot lives decides who could change it before the loader reads it:

    - by default (a loader in this process or its model child: the transformers backend,
      the training worker) in :func:`private_snapshot_root`, a 0700 folder on local disk
      made for this process alone, outside ``ADAPTER_DIR`` (which training nodes write).
      Pass ``version.approved_sha256`` to ``load_adapter``: the transformers backend
      hashes the snapshot again right before it reads it and refuses a mismatch
      (:class:`~counselor_engine.backends.adapter_files.AdapterRefused`).
    - ``shared=True`` (a vLLM server, maybe on another node, reads the path) in
      ``ADAPTER_DIR/.verified/``, the one place such a server can read; what holds there
      is said in :meth:`VLLMBackend.load_adapter
      <counselor_engine.backends.vllm_backend.VLLMBackend.load_adapter>`.
    """
    version.refresh_from_db(fields=["status", "path", "approved_sha256"])
    if version.status not in SERVABLE or not version.approved_sha256:
        raise NotServable(f"{version.name} is {version.status}, not approved")
    files = _verified_files(version, version.approved_sha256)
    base = _shared_snapshot_root() if shared else private_snapshot_root()
    folder = _snapshot(base, version, files)
    prune_snapshots(keep=folder.name)
    return folder


def _snapshot_name(version: AdapterVersion) -> str:
    return f"{version.name}-{version.approved_sha256[:16]}"


def _shared_snapshot_root() -> Path:
    return Path(settings.ADAPTER_DIR) / ".verified"


_PRIVATE_PREFIX = "psyevo-adapters-"
_private_roots: dict[int, Path] = {}  # pid -> root: a forked child makes its own


def private_snapshot_root() -> Path:
    """This process's own snapshot folder: ``$TMPDIR/psyevo-adapters-<pid>-<random>/``,
    mode 0700, made on first use (``tempfile.mkdtemp``: nobody else can have made or
    pre-planted it) and removed at exit. Keyed by pid, so a forked worker does not share
    its parent's. Folders left by processes that died without cleaning up (same owner,
    pid gone) are removed when a new one is made."""
    pid = os.getpid()
    root = _private_roots.get(pid)
    if root is not None and root.is_dir():
        return root
    parent = Path(tempfile.gettempdir())  # local disk ($TMPDIR), never the shared store
    _remove_dead_private_roots(parent)
    root = Path(tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{pid}-", dir=parent))
    _private_roots[pid] = root
    atexit.register(_remove_private_root, pid, root)
    return root


def _remove_private_root(pid: int, root: Path) -> None:
    if os.getpid() == pid:  # a forked child inherits the atexit hook: not its folder
        shutil.rmtree(root, ignore_errors=True)


def _remove_dead_private_roots(parent: Path) -> None:
    with contextlib.suppress(OSError):
        for folder in parent.glob(f"{_PRIVATE_PREFIX}*-*"):
            try:
                pid = int(folder.name[len(_PRIVATE_PREFIX) :].split("-", 1)[0])
                owned = folder.lstat().st_uid == os.getuid() and folder.is_dir()
            except (ValueError, OSError):
                continue
            if owned and not folder.is_symlink() and not pid_alive(pid):
                shutil.rmtree(folder, ignore_errors=True)


def prune_snapshots(*, keep: str = "") -> list[str]:
    """Remove the snapshot folders nothing can load any more; returns their names.

    A snapshot is needed while its version may still be loaded: approved or active, or
    retired but pinned by a session still open (a session keeps its version to the end).
    Folders of rejected, failed or unpinned retired versions, and of an approval digest
    that is no longer the version's, are removed, so copies of old weights do not pile
    up. Both this process's private root and the shared ``ADAPTER_DIR/.verified/`` are
    pruned. ``keep`` (the folder just written) is never removed, whatever a concurrent
    decision did meanwhile. Called on every :func:`servable_path`."""
    bases = [b for b in (private_snapshot_root(), _shared_snapshot_root()) if b.is_dir()]
    if not bases:
        return []
    pinned = Session.objects.filter(status=Session.Status.OPEN).values("adapter_version_id")
    needed = AdapterVersion.objects.filter(
        Q(status__in=(Status.APPROVED, Status.ACTIVE)) | Q(status=Status.RETIRED, pk__in=pinned)
    ).exclude(approved_sha256="")
    wanted = {_snapshot_name(v) for v in needed} | {keep}
    removed = []
    for base in bases:
        for folder in sorted(base.iterdir()):
            if folder.name in wanted or not folder.is_dir() or folder.is_symlink():
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    if removed:
        log.info("removed %d adapter snapshot(s) nothing can load: %s", len(removed), removed)
    return removed


def _snapshot(base: Path, version: AdapterVersion, files: dict[str, bytes]) -> Path:
    """Write the verified ``files`` into ``<base>/<name>-<sha>/`` (owner only). Every call
    rewrites each file from the verified bytes through a temporary file and an atomic
    rename, and removes anything else there, so a concurrent loader sees only whole
    verified files, whatever was in the folder before."""
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = base / _snapshot_name(version)
    folder.mkdir(mode=0o700, exist_ok=True)
    for rel, data in files.items():
        target = folder / rel
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    for path in sorted(folder.rglob("*"), reverse=True):
        rel = path.relative_to(folder).as_posix()
        if rel in files or (path.is_dir() and not path.is_symlink()):
            continue
        if path.name.startswith(".tmp-") and path.is_file() and not path.is_symlink():
            continue  # another process's write in flight
        path.unlink()
    return folder


# -- decisions --------------------------------------------------------------------------


def approve(version: AdapterVersion, clinician: User, note: str = "") -> AdapterVersion:
    """Approve a pending version and make it the active one, retiring the previous.

    Only a user with role ``clinician`` may approve: admins can view the gate and roll
    back, but a model update reaches clients only on a clinician's judgement. The
    operator who started the round (``TrainingRun.started_by``) cannot approve its
    output. The digest is recomputed now and stored as ``approved_sha256``: the approval
    covers exactly the files the clinician was shown the report for.

    A version whose parent is not the active version is marked superseded instead (that
    marking commits) and :class:`SupersededVersion` is raised.
    """
    if getattr(clinician, "role", None) != Role.CLINICIAN:
        raise DecisionRefused("only a clinician can approve an adapter version")
    run = TrainingRun.objects.filter(output_version=version).first()
    if run is not None and run.started_by_id == clinician.pk:
        raise DecisionRefused("you started the round that produced this version")
    stale: list[str] = []
    with transaction.atomic():
        # The scope lock serialises this with every other approval and rollback, so the
        # active version read below cannot change before we commit.
        schedule.lock_scope()
        current = AdapterVersion.objects.select_for_update().get(pk=version.pk)
        if current.status != Status.PENDING_APPROVAL:
            raise DecisionRefused(f"{current.name} is {current.status}, not pending approval")
        if current.evidence_erased:  # erasure fails such a version too; this is the gate's
            raise DecisionRefused(f"{current.name} trained on an erased client's evidence")
        active = active_version()
        if current.parent_id != (active.pk if active else None):
            stale = _supersede_locked([current], active, clinician)
        else:
            _approve_locked(current, clinician, note, run)
    if stale:
        raise SupersededVersion(stale[0])
    current.refresh_from_db()
    return current


def _approve_locked(
    current: AdapterVersion, clinician: User, note: str, run: TrainingRun | None
) -> None:
    """pending -> approved -> active, superseding its pending siblings, consuming its
    evidence (caller holds the scope lock and the version row)."""
    sha = _files_match(current, current.sha256)
    now = timezone.now()
    updated = AdapterVersion.objects.filter(pk=current.pk, status=Status.PENDING_APPROVAL).update(
        status=Status.APPROVED,
        approved_by=clinician,
        approved_at=now,
        approved_sha256=sha,
        decision_note=note.strip(),
    )
    if updated != 1:  # Nothing got updated: another process got there first.
        raise DecisionRefused(f"{current.name} was decided meanwhile")
    audit.record(clinician, "adapter.approve", target=_target(current), sha256=sha, note=note)
    retired = _activate_locked(current, clinician, now)
    _supersede_stale_locked(current, clinician)
    if run is not None:
        consumed = CandidateGroup.objects.filter(
            lease_run=run, buffer_status=CandidateGroup.Buffer.RESERVED
        ).update(buffer_status=CandidateGroup.Buffer.CONSUMED, lease_expires_at=None)
        log.info("%s activated; %d evidence groups consumed", current.name, consumed)
    _sync_serving_on_commit(current.pk, retired)


def supersede_if_stale(version: AdapterVersion) -> str:
    """A version that just reached the gate (the worker's hand-off) while its parent had
    stopped being active (a sibling was approved, or a rollback, during training) is
    superseded at once rather than waiting for a clinician to try. Returns the reason,
    or "" when it is approvable (or no longer pending)."""
    with transaction.atomic():
        schedule.lock_scope()
        current = AdapterVersion.objects.select_for_update().get(pk=version.pk)
        active = active_version()
        if current.status != Status.PENDING_APPROVAL or current.parent_id == (
            active.pk if active else None
        ):
            return ""
        reasons = _supersede_locked([current], active, None)
    return reasons[0] if reasons else ""


def reject(version: AdapterVersion, clinician: User, reason: str) -> AdapterVersion:
    """Reject a pending version (reason required); its reserved evidence goes back to
    the buffer for later rounds. The active version is untouched."""
    if getattr(clinician, "role", None) != Role.CLINICIAN:
        raise DecisionRefused("only a clinician can reject an adapter version")
    reason = reason.strip()
    if not reason:
        raise DecisionRefused("a reason is required to reject a version")
    with transaction.atomic():
        updated = AdapterVersion.objects.filter(
            pk=version.pk, status=Status.PENDING_APPROVAL
        ).update(status=Status.REJECTED, decision_note=reason)
        if updated != 1:
            raise DecisionRefused(f"{version.name} is not pending approval")
        run = TrainingRun.objects.filter(output_version=version).first()
        returned = return_evidence(run) if run is not None else 0
        audit.record(
            clinician, "adapter.reject", target=_target(version), reason=reason, returned=returned
        )
    version.refresh_from_db()
    return version


def rollback(version: AdapterVersion, actor: User, reason: str = "") -> AdapterVersion:
    """Re-activate an earlier approved version (clinician or admin), retiring the active
    one. Its files must still match the digest that was approved."""
    if getattr(actor, "role", None) not in (Role.CLINICIAN, Role.ADMIN):
        raise DecisionRefused("only clinicians and admins can roll back")
    with transaction.atomic():
        schedule.lock_scope()
        current = AdapterVersion.objects.select_for_update().get(pk=version.pk)
        if current.status not in (Status.APPROVED, Status.RETIRED):
            raise DecisionRefused(
                f"{current.name} is {current.status}: only an earlier "
                "approved version can be re-activated"
            )
        _files_match(current, current.approved_sha256)
        previous = active_version()
        retired = _activate_locked(current, actor, timezone.now())
        _supersede_stale_locked(current, actor)
        audit.record(
            actor,
            "adapter.rollback",
            target=_target(current),
            previous=previous.name if previous else None,
            reason=reason,
        )
        _sync_serving_on_commit(current.pk, retired)
    current.refresh_from_db()
    return current


def _activate_locked(version: AdapterVersion, actor: User, now: datetime) -> list[int]:
    """Retire the active version and activate ``version`` (caller holds the scope lock).
    Returns the ids retired. Retiring first keeps ``one_active_adapter`` satisfied."""
    retired = list(
        AdapterVersion.objects.filter(status=Status.ACTIVE)
        .exclude(pk=version.pk)
        .values_list("pk", flat=True)
    )
    AdapterVersion.objects.filter(pk__in=retired, status=Status.ACTIVE).update(
        status=Status.RETIRED, retired_at=now
    )
    updated = AdapterVersion.objects.filter(
        pk=version.pk, status__in=[Status.APPROVED, Status.RETIRED]
    ).update(status=Status.ACTIVE, activated_at=now, retired_at=None)
    if updated != 1:
        raise DecisionRefused(f"{version.name} could not be activated")
    audit.record(actor, "adapter.activate", target=_target(version), retired=retired)
    return retired


def _supersede_stale_locked(active: AdapterVersion, actor: User | None) -> list[str]:
    """Mark every pending version not trained from ``active`` (just activated) superseded
    (caller holds the scope lock). Returns the reasons."""
    stale = list(
        AdapterVersion.objects.select_for_update()
        .filter(status=Status.PENDING_APPROVAL)
        .exclude(parent=active)
    )
    return _supersede_locked(stale, active, actor) if stale else []


def _supersede_locked(
    versions: list[AdapterVersion], active: AdapterVersion | None, actor: User | None
) -> list[str]:
    """pending_approval -> superseded for ``versions``, each with its reason; return each
    one's reserved evidence to the buffer, then queue a round from the active version if
    the buffer now holds an admissible batch (on commit). Caller holds the scope lock."""
    reasons = []
    for version in versions:
        parent = version.parent.name if version.parent else "the base model"
        now_active = active.name if active else "the base model"
        updated = AdapterVersion.objects.filter(
            pk=version.pk, status=Status.PENDING_APPROVAL
        ).update(status=Status.SUPERSEDED)
        if updated != 1:
            # Nothing got updated: decided meanwhile (only a writer that skips the scope
            # lock could do that); leave it and its evidence as they are.
            continue
        run = TrainingRun.objects.filter(output_version=version).first()
        returned = return_evidence(run) if run is not None else 0
        reason = (
            f"{version.name} was trained from {parent}, but {now_active} is active now: "
            f"approving it would drop the active update. Superseded; {returned} evidence "
            f"groups returned to the buffer for a round from {now_active}."
        )
        AdapterVersion.objects.filter(pk=version.pk).update(decision_note=reason)
        audit.record(
            actor, "adapter.supersede", target=_target(version), parent=parent,
            active=now_active, returned=returned,
        )  # fmt: skip
        log.warning("%s", reason)
        reasons.append(reason)
    if reasons:
        schedule.queue_round_from_active(trigger="superseded")
    return reasons


def _target(version: AdapterVersion) -> str:
    return f"adapter:{version.name}"


# -- evidence ---------------------------------------------------------------------------


def return_evidence(run: TrainingRun) -> int:
    """Reserved groups leased to ``run`` go back to the buffer (a failed or rejected
    round: the paper's "returns the reserved graphs"). Returns how many."""
    return CandidateGroup.objects.filter(
        lease_run=run, buffer_status=CandidateGroup.Buffer.RESERVED
    ).update(buffer_status=CandidateGroup.Buffer.AVAILABLE, lease_run=None, lease_expires_at=None)


def release_expired_leases(now: datetime | None = None) -> int:
    """Return evidence whose lease ran out, and fail the rounds that held it.

    A worker killed in any phase leaves its run ``running`` and its groups ``reserved``;
    once ``lease_expires_at`` passes (the live worker renews it at every phase and step),
    the worker is presumed dead: its groups become available again, the run is failed
    (a redelivered task for it is then a no-op) and its unfinished version is failed.
    Groups held for a pending approval have no expiry and are never touched here.
    Called at the start of every round and by ``manage.py lipo_round``. ``now`` is for
    tests. Returns the number of groups released.
    """
    now = now or timezone.now()
    with transaction.atomic():
        stale_runs = list(
            TrainingRun.objects.select_for_update(skip_locked=True).filter(
                status=TrainingRun.Status.RUNNING, lease_expires_at__lt=now
            )
        )
        for run in stale_runs:
            TrainingRun.objects.filter(pk=run.pk, status=TrainingRun.Status.RUNNING).update(
                status=TrainingRun.Status.FAILED,
                finished_at=now,
                error=f"worker lost: lease expired during phase {run.phase or '?'} "
                f"(attempt {run.attempts})",
            )
            fail_unfinished_version(run, f"worker lost during phase {run.phase or '?'}")
        released = CandidateGroup.objects.filter(
            buffer_status=CandidateGroup.Buffer.RESERVED, lease_expires_at__lt=now
        ).update(
            buffer_status=CandidateGroup.Buffer.AVAILABLE, lease_run=None, lease_expires_at=None
        )
    if released or stale_runs:
        log.warning("released %d evidence groups from %d lost rounds", released, len(stale_runs))
    return released


def fail_unfinished_version(run: TrainingRun, reason: str) -> None:
    """A version still training or validating for ``run`` will never finish: fail it."""
    if run.output_version_id is None:
        return
    AdapterVersion.objects.filter(
        pk=run.output_version_id, status__in=[Status.TRAINING, Status.VALIDATING]
    ).update(status=Status.FAILED, decision_note=reason)


def lease_deadline(now: datetime | None = None) -> datetime:
    minutes: int = settings.LIPO.lease_minutes
    return (now or timezone.now()) + timedelta(minutes=minutes)


# -- serving hook -----------------------------------------------------------------------


def _sync_serving_on_commit(activated_pk: int, retired: list[int]) -> None:
    transaction.on_commit(lambda: sync_serving(activated_pk, retired))


def sync_serving(activated_pk: int, retired: list[int]) -> None:
    """With the vLLM backend, load the newly active adapter into the running server by
    name and unload retired versions that no open session still pins.

    Runs after commit, so the database already says which version is active whatever
    happens here; a failure is logged and stored in ``load_error`` for the approval page,
    and never leaves two versions active. The transformers backend loads adapters in
    process when a session pins one (through :func:`servable_path`), so it needs nothing.
    """
    if settings.PSYEVO_BACKEND != "vllm":
        return
    from counselor_engine.backends.vllm_backend import VLLMBackend  # its HTTP client: vLLM only

    backend = VLLMBackend(
        settings.PSYEVO_VLLM_URL or "",
        model=getattr(settings, "PSYEVO_VLLM_MODEL", "") or "base",
        timeout=10.0,
    )
    version = AdapterVersion.objects.get(pk=activated_pk)
    try:
        path = servable_path(version, shared=True)
        async_to_sync(backend.load_adapter)(version.name, str(path.resolve()))
        error = ""
    except Exception as exc:  # the server is down, refused, or the files were tampered
        log.error("could not load adapter %s into vLLM: %s", version.name, exc)
        error = f"{type(exc).__name__}: {exc}"
    AdapterVersion.objects.filter(pk=activated_pk).update(load_error=error)
    # Retired now, or lately while a session still pinned it (unloading is idempotent).
    recent = Q(pk__in=retired) | Q(
        status=Status.RETIRED, retired_at__gte=timezone.now() - UNLOAD_WINDOW
    )
    unused = AdapterVersion.objects.filter(recent).exclude(pk=activated_pk)
    for old in unused.exclude(sessions__status="open").distinct():
        try:
            async_to_sync(backend.unload_adapter)(old.name)
        except Exception as exc:
            log.error("could not unload adapter %s from vLLM: %s", old.name, exc)
            AdapterVersion.objects.filter(pk=old.pk).update(load_error=f"unload: {exc}")
