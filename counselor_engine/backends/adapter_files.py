"""An adapter folder's bytes and their digest, shared by the approval gate and the loaders.

The approval gate (``webapp.learning.services``) binds a clinician's approval to
:func:`files_digest` of a version's files; an in-process loader recomputes the same digest
over the folder it is about to load (:func:`verify_adapter`), so a file changed between the
gate's check and the load is refused instead of served. No Django here: the engine imports
neither the web side nor the worker.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .base import BackendError


class AdapterRefused(BackendError):
    """The adapter's files are missing, contain a symlink, or do not match the digest the
    caller was told to expect: nothing was loaded."""


def read_adapter_files(directory: Path | str) -> dict[str, bytes]:
    """Every regular file of an adapter folder, read once: relative path -> bytes.
    Symlinks are refused: they could point the loader anywhere."""
    root = Path(directory)
    if not root.is_dir():
        raise AdapterRefused(f"adapter folder {root} is missing")
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        if path.is_symlink():
            raise AdapterRefused(f"adapter folder {root} contains a symlink: {path.name}")
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def files_digest(files: dict[str, bytes]) -> str:
    """sha256 over an adapter's files in sorted relative-path order, each contributing
    ``path \\0 size \\0 content``: renaming, adding or removing a file changes the digest,
    not only editing one (a planted extra file is tampering too)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        data = files[rel]
        digest.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(data)
    return digest.hexdigest()


def verify_adapter(name: str, directory: Path | str, sha256: str) -> None:
    """Raise :class:`AdapterRefused` unless the folder's files have digest ``sha256``."""
    actual = files_digest(read_adapter_files(directory))
    if actual != sha256:
        raise AdapterRefused(
            f"adapter {name!r}: files in {directory} do not match the approved sha256 "
            f"(expected {sha256[:12]}…, found {actual[:12]}…); not loaded"
        )
