"""The shipped crisis-model artifacts and their manifest (docs/architecture.md, "Generated
artifacts"): the manifest matches the files, a load refuses a file that does not match,
and promotion is the one way a trained file replaces a shipped one."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from counselor_engine import safety
from counselor_engine.safety import artifacts, crisis_model, registry
from scripts import train_safety


@pytest.fixture(autouse=True)
def _fresh_model():
    registry.reset()
    yield
    registry.reset()


def test_the_manifest_matches_the_shipped_files() -> None:
    listed = artifacts.manifest()
    shipped = sorted(p.name for p in artifacts.SHIPPED_DIR.glob("crisis_model_*.npz"))
    assert sorted(listed) == shipped
    for name, entry in listed.items():
        path = artifacts.SHIPPED_DIR / name
        assert artifacts.sha256(path) == entry["sha256"], f"{name}: promote it, or restore it"
        assert path.stat().st_size == entry["bytes"]
        assert artifacts.verified(path) == path


def _copy_shipped(directory: Path) -> Path:
    shutil.copyfile(artifacts.SHIPPED_DIR / artifacts.MANIFEST_NAME,
                    directory / artifacts.MANIFEST_NAME)  # fmt: skip
    path = directory / "crisis_model_hash.npz"
    shutil.copyfile(crisis_model.artifact_path("hash"), path)
    return path


def test_a_changed_artifact_is_refused_with_both_hashes(tmp_path: Path) -> None:
    path = _copy_shipped(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    expected = artifacts.manifest(tmp_path)["crisis_model_hash.npz"]["sha256"]
    with pytest.raises(artifacts.ArtifactError, match=f"does not match the manifest's {expected}"):
        artifacts.verified(path)
    with pytest.raises(artifacts.ArtifactError, match="not listed"):
        artifacts.verified(tmp_path / "stray.npz")


def test_a_shipped_file_that_fails_its_check_leaves_the_rules_in_charge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _copy_shipped(tmp_path)
    path.write_bytes(path.read_bytes()[:-1])
    monkeypatch.setattr(crisis_model, "artifact_path", lambda encoder: path)
    monkeypatch.setattr(registry, "preferred_encoder", lambda: "hash")
    with caplog.at_level(logging.ERROR):
        assert registry.get_model() is None
        assert safety.assess("i want to kill myself").level == "crisis"
    assert "does not match the manifest" in caplog.text


def test_training_writes_outside_the_package_and_promotion_updates_the_manifest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PSYEVO_DATA_DIR", str(tmp_path / "data"))
    assert artifacts.trained_dir() == tmp_path / "data" / "safety"
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    _copy_shipped(shipped)
    trained = tmp_path / "out" / "crisis_model_hash.npz"
    trained.parent.mkdir()
    trained.write_bytes(b"a newly trained model")
    shutil.copyfile(trained, shipped / trained.name)  # replaced by hand, not promoted
    with pytest.raises(artifacts.ArtifactError, match="does not match"):
        artifacts.verified(shipped / trained.name)
    before = artifacts.manifest(shipped)
    artifacts.promote(trained, shipped)
    assert (shipped / trained.name).read_bytes() == b"a newly trained model"
    after = json.loads((shipped / artifacts.MANIFEST_NAME).read_text())["artifacts"]
    assert after[trained.name] == {"sha256": artifacts.sha256(trained), "bytes": 21}
    assert {k: v for k, v in after.items() if k != trained.name} == {
        k: v for k, v in before.items() if k != trained.name
    }
    assert artifacts.verified(shipped / trained.name)
    with pytest.raises(artifacts.ArtifactError, match="nothing to promote"):
        artifacts.promote(tmp_path / "out" / "crisis_model_minilm.npz", shipped)


def test_the_training_script_promotes_only_what_it_was_asked_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    promoted: list[Path] = []
    monkeypatch.setattr(artifacts, "promote", promoted.append)
    assert train_safety.main(["--encoder", "hash", "--out", str(tmp_path), "--promote"]) == 0
    assert promoted == [tmp_path / "crisis_model_hash.npz"]
