"""Crisis messages held while PostgreSQL is down, kept on disk until written (issue 17).

When the crisis transaction cannot reach PostgreSQL, the safe reply goes out from memory
and the message, its reply and its flag are held until storage returns
(``turns._write_when_storage_returns``). Held in memory only, they would die with the
process, and no clinician would ever hear of that crisis. So each held crisis is also
written here, to ``CRISIS_SPOOL_DIR`` (owner only, local disk under the data folder):

1. :func:`hold` writes one file per message, created exclusively and append-only, and
   fsyncs it and its folder before returning.
2. Whoever writes it to PostgreSQL deletes it: the task holding it in memory, or
   :func:`replay`, which runs after any later successful crisis or message write and at
   process start (``webapp.asgi``), in any process that shares the folder.
3. The crisis transaction is idempotent per client message id (``record_safe_reply``),
   so a record written twice (a replay racing the holding task, two processes replaying
   at once) is stored once and raises one flag.

One file per message, not one journal: deleting what was written is then one unlink,
with no rewrite of a journal that another process may be appending to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from counselor_engine.safety import SafetyAssessment
from webapp.accounts.models import User
from webapp.counseling import services
from webapp.lib import crypto

log = logging.getLogger(__name__)
FORMAT = 1
_replaying = threading.Lock()  # one replay per process at a time
# A replay asked for while one runs: the running one scans again before it stops, so a
# record spooled after its scan began is not left waiting for the next write.
_requested = threading.Event()
_holding: set[str] = set()  # file names a live task of this process is writing itself


@dataclass(frozen=True)
class HeldCrisis:
    session_id: int
    author_id: int | None
    client_msg_id: str
    text: str
    assessment: SafetyAssessment
    reply: str

    def to_json(self) -> bytes:
        """Encrypted with the keys that protect turn text in PostgreSQL: the spool holds
        a client's words in crisis, and must not leave them readable on disk."""
        body = asdict(self)
        body["format"] = FORMAT
        return crypto.encrypt(json.dumps(body, ensure_ascii=False)).encode("ascii") + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> HeldCrisis:
        token = data.decode("ascii", errors="replace").strip()
        body = json.loads(crypto.decrypt(token, where="a crisis spool record"))
        if body.pop("format", None) != FORMAT:
            raise ValueError("unknown spool record format")
        a = body.pop("assessment")
        assessment = SafetyAssessment(
            level=a["level"],
            categories=tuple(a["categories"]),
            matched=tuple(a["matched"]),
            reasons=tuple(a["reasons"]),
        )
        return cls(assessment=assessment, **body)


def folder() -> Path:
    return Path(settings.CRISIS_SPOOL_DIR)


def _fsync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hold(record: HeldCrisis) -> str | None:
    """Write ``record`` durably; returns its file name (None: the disk failed too, logged;
    the record is then held in memory only)."""
    base = folder()
    name = f"{time.time_ns()}-{secrets.token_hex(6)}.json"
    partial = base / f"{name}.part"  # not listed by pending() until it is whole
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            os.write(fd, record.to_json())
            os.fsync(fd)
        finally:
            os.close(fd)
        # Claimed before it becomes visible: a replay of this process leaves it to the
        # holding task, and no replay can read it half-written (and set it aside as .bad).
        _holding.add(name)
        os.rename(partial, base / name)
        _fsync_folder(base)
    except OSError:
        _holding.discard(name)
        with contextlib.suppress(OSError):
            partial.unlink()
        log.critical("session %s: held crisis not spooled to %s", record.session_id, base,
                     exc_info=True)  # fmt: skip
        return None
    return name


def release(name: str | None) -> None:
    """The record was written to PostgreSQL (or can never be): remove its file."""
    if name is None:
        return
    _holding.discard(name)
    with contextlib.suppress(FileNotFoundError):
        (folder() / name).unlink()
        _fsync_folder(folder())


def pending() -> list[str]:
    """File names of spooled records (a cheap check: the folder is almost always empty)."""
    try:
        return sorted(e.name for e in os.scandir(folder()) if e.name.endswith(".json"))
    except FileNotFoundError:
        return []


def replay() -> int:
    """Write every spooled record this process is not already holding itself, send its
    flag's notifications, and delete it; returns how many were written. Stops at the first
    database error (storage is still down: the rest wait for the next replay). Blocking:
    run it on a worker thread.

    Asked for while another replay of this process runs, it returns 0 at once and the
    running one scans the folder again when it is done (found by a test: a replay started
    at process start while a write's replay was still sending its notifications skipped,
    and the record waited for the next write)."""
    _requested.set()
    if not _replaying.acquire(blocking=False):
        return 0
    written = 0
    storage_down = False
    notifications: list[Callable[[], None]] = []
    try:
        while _requested.is_set() and not storage_down:
            _requested.clear()
            done, storage_down = _replay_once(notifications)
            written += done
    finally:
        _replaying.release()
    # The flags are stored; their pushes and e-mail tasks run outside the lock, so a slow
    # channel layer or broker never holds up the next replay.
    for step in notifications:
        try:
            step()
        except Exception:
            log.exception("a flag notification step failed (the flag is stored)")
    if _requested.is_set() and not storage_down:
        written += replay()  # asked for between the last scan and the release
    return written


def _replay_once(notifications: list[Callable[[], None]]) -> tuple[int, bool]:
    """One scan of the folder: ``(records written, storage is down)``; the written flags'
    notification steps are appended to ``notifications``."""
    written = 0
    for name in pending():
        if name in _holding:
            continue
        path = folder() / name
        try:
            record = HeldCrisis.from_json(path.read_bytes())
        except FileNotFoundError:
            continue  # written and removed by another process meanwhile
        except (OSError, ValueError, KeyError, TypeError, crypto.DecryptionError):
            log.critical("unreadable crisis spool record %s: kept as .bad", path)
            with contextlib.suppress(OSError):
                path.rename(path.with_suffix(".bad"))
            continue
        try:
            author = (
                User.objects.filter(pk=record.author_id).first()
                if record.author_id is not None
                else None
            )
            safe = services.record_safe_reply(
                record.session_id, record.text, author=author,
                client_msg_id=record.client_msg_id, assessment=record.assessment,
                reply=record.reply,
            )  # fmt: skip
        except DatabaseError as exc:
            log.warning("crisis spool: storage still down: %s", exc)
            return written, True
        except services.SessionError as exc:
            log.critical("crisis spool: %s not written (%s): kept as .failed", name, exc.code)
            with contextlib.suppress(OSError):
                path.rename(path.with_suffix(".failed"))
            continue
        log.warning("session %s: spooled crisis written (turn %s)", record.session_id,
                    safe.message.seq)  # fmt: skip
        notifications.extend(safe.dispatch)  # the flag's pushes and e-mail task
        release(name)
        written += 1
    return written, False


def replay_soon() -> None:
    """Replay on a thread of its own, never on a shared pool: a crisis record must not wait
    behind notification jobs (storage may still be down: then the records wait for the
    next successful write). Called at process start (crises a previous process held when
    it died) and after each successful write."""

    def run() -> None:
        from django.db import connection

        try:
            if pending():
                replay()
        except Exception:
            log.exception("crisis spool: replay failed")
        finally:
            connection.close()

    threading.Thread(target=run, name="psyevo-crisis-spool", daemon=True).start()


def as_record(
    session_id: int, author: Any, msg_id: str, text: str, assessment: SafetyAssessment, reply: str
) -> HeldCrisis:
    author_id = getattr(author, "pk", None)
    return HeldCrisis(session_id, author_id, msg_id, text, assessment, reply)
