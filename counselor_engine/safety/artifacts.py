"""The shipped model artifacts and their manifest: what a load trusts, and how a new
artifact replaces one.

Trained crisis models (``data/safety/crisis_model_*.npz``) are generated files committed to
the repository, because rebuilding them is neither cheap (minutes to tens of minutes on 2
CPU cores) nor, for the tuned model, bit-identical. To stop every experimental retrain from
adding a full copy to the history, the training scripts write under the data folder
(``$PSYEVO_DATA_DIR/safety``) by default, and replacing a shipped file is one explicit step,
``--promote`` (:func:`promote`), which also records the file's sha256 in
``data/safety/manifest.json``. Every load of a shipped artifact checks that hash
(:func:`verified`), so a file replaced by hand, truncated by a checkout, or mixed up with
another version is refused with a message saying so, and the rules answer alone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "data" / "safety"
MANIFEST_NAME = "manifest.json"


class ArtifactError(RuntimeError):
    """A shipped artifact does not match its manifest entry (or has none)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(directory: Path = SHIPPED_DIR) -> dict[str, dict[str, object]]:
    """``{file name: {"sha256": ..., "bytes": ...}}`` of the artifacts in ``directory``."""
    path = directory / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no artifact manifest") from None
    return data["artifacts"]  # type: ignore[no-any-return]


def verified(path: Path) -> Path:
    """``path`` itself once its sha256 is the one the manifest next to it records; else
    :class:`ArtifactError` naming the file, both hashes and the way out."""
    entry = manifest(path.parent).get(path.name)
    if entry is None:
        raise ArtifactError(f"{path}: not listed in {path.parent / MANIFEST_NAME}")
    got = sha256(path)
    if got != entry["sha256"]:
        raise ArtifactError(
            f"{path}: sha256 {got} does not match the manifest's {entry['sha256']}. The file "
            "was changed without promotion: restore it (git checkout -- <file>), or promote "
            "a trained one with the training script's --promote"
        )
    return path


def trained_dir(out: Path | None = None) -> Path:
    """Where the training scripts write: ``out``, else ``<data folder>/safety``
    (:func:`counselor_engine.models.default_data_dir`; git-ignored in a checkout)."""
    from counselor_engine.models import default_data_dir

    return out if out is not None else default_data_dir() / "safety"


def promote(source: Path, directory: Path = SHIPPED_DIR) -> Path:
    """Copy a trained artifact over the shipped one of the same name and record its sha256
    and size in the manifest. Returns the shipped path."""
    if not source.is_file():
        raise ArtifactError(f"{source}: nothing to promote; run the training script first")
    target = directory / source.name
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    path = directory / MANIFEST_NAME
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"artifacts": {}}
    data["artifacts"][target.name] = {"sha256": sha256(target), "bytes": target.stat().st_size}
    data["artifacts"] = dict(sorted(data["artifacts"].items()))
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return target
