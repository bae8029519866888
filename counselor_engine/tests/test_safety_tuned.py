"""The tuned crisis classifier and the ensemble that serves it (counselor_engine.safety.tuned_model).

The figures on labelled rounds are in ``test_safety_model.py`` (they measure whatever
serves); here: the artifact, its failure paths and the averaging.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from counselor_engine import safety
from counselor_engine.safety import registry, tuned_model
from scripts import train_safety_tuned

pytestmark = pytest.mark.skipif(
    not (tuned_model.available() and tuned_model.ARTIFACT.exists()),
    reason="the tuned crisis model needs the MiniLM package, transformers and peft",
)


@pytest.fixture(autouse=True)
def _fresh_model():
    registry.reset()
    yield
    registry.reset()


@pytest.fixture(scope="module")
def tuned() -> tuned_model.TunedCrisisModel:
    return tuned_model.TunedCrisisModel.load()


def test_the_artifact_is_small_and_trained_on_the_current_data(
    tuned: tuned_model.TunedCrisisModel,
) -> None:
    assert tuned_model.ARTIFACT.stat().st_size < 2_000_000
    assert tuned.head.shape == (2, tuned_model.HIDDEN + 1)
    assert tuned.thresholds == train_safety_tuned.THRESHOLDS
    assert not train_safety_tuned.stale(tuned), (
        "rerun python -m scripts.train_safety_tuned, then --promote"
    )
    assert train_safety_tuned.main(["--check"]) == 0


def test_it_scores_in_batches_like_one_by_one(tuned: tuned_model.TunedCrisisModel) -> None:
    texts = ["i gave my dog away and wrote the letters", "gtg, ttyl", "what's the weather"]
    together = tuned.probabilities([safety.normalise(t) for t in texts])
    alone = np.concatenate([tuned.probabilities([safety.normalise(t)]) for t in texts])
    assert together.shape == (3, 2) and np.all((together >= 0) & (together <= 1))
    np.testing.assert_allclose(together, alone, atol=1e-4)
    assert tuned.probabilities([]).shape == (0, 2)


def _rewrite(path: Path, **changes: object) -> None:
    with np.load(tuned_model.ARTIFACT, allow_pickle=False) as data:
        arrays = {k: np.asarray(data[k]) for k in data.files}
    header = json.loads(bytes(arrays["header"]).decode("utf-8"))
    for key, value in changes.items():
        if key == "head":
            arrays["head"] = value  # type: ignore[assignment]
        elif key == "drop_adapters":
            arrays = {k: v for k, v in arrays.items() if not k.startswith("lora/")}
        else:
            header[key] = value
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    with path.open("wb") as fh:
        np.savez_compressed(fh, **arrays)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": 99}, "format"),
        ({"head": np.zeros((1, 385), dtype=np.float32)}, "malformed"),
        ({"thresholds": {"crisis": 0.5}}, "malformed"),
        ({"drop_adapters": True}, "malformed"),
    ],
)
def test_a_malformed_artifact_is_refused(tmp_path: Path, changes: dict, message: str) -> None:
    _rewrite(tmp_path / "bad.npz", **changes)
    with pytest.raises(ValueError, match=message):
        tuned_model.TunedCrisisModel.load(tmp_path / "bad.npz")


def test_the_ensemble_serves_where_it_loads() -> None:
    model = registry.get_model()
    assert model is not None and model.encoder == tuned_model.ENSEMBLE
    assert registry.preferred_encoder() == tuned_model.ENSEMBLE


def test_a_broken_tuned_artifact_leaves_the_minilm_model_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "crisis_model_tuned.npz"
    broken.write_bytes(b"not an npz")
    monkeypatch.setattr(tuned_model, "ARTIFACT", broken)
    with caplog.at_level(logging.ERROR):
        model = registry.get_model()
    assert model is not None and model.encoder == "minilm"
    assert "tuned crisis model unavailable" in caplog.text
    assert safety.assess("i want to kill myself").level == "crisis"


class _Fixed:
    """A reader that answers the same probabilities for every message; ``plain`` says
    whether its plain-chat gate silences it (the minilm reader's)."""

    def __init__(self, risk: float, crisis: float, plain: bool = False) -> None:
        self.answer = np.array([risk, crisis])
        self.plain_chat = plain

    def probabilities(self, norms: list[str]) -> np.ndarray:
        return np.tile(self.answer, (len(norms), 1))

    def read(self, norms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.probabilities(norms), np.full(len(norms), self.plain_chat)


@pytest.mark.parametrize(
    ("tuned_p", "kernel_p", "level"),
    [
        ((0.9, 0.9), (0.9, 0.2), "crisis"),  # mean crisis 0.55
        ((0.9, 0.5), (0.9, 0.2), "crisis"),  # mean crisis 0.35: the threshold itself
        ((0.9, 0.4), (0.9, 0.2), "concern"),  # mean crisis 0.30, risk 0.9
        ((0.8, 0.1), (0.4, 0.1), "none"),  # mean risk 0.6: below the concern threshold 0.7
        ((0.6, 0.1), (0.3, 0.1), "none"),  # mean risk 0.45
        ((0.0, 0.0), (1.0, 1.0), "crisis"),  # one sure reader is enough
        ((0.0, 0.0), (0.7, 0.7), "crisis"),  # ... or one fairly sure one: mean crisis 0.35
    ],
)
def test_the_ensemble_averages_its_two_readers(
    tuned_p: tuple[float, float], kernel_p: tuple[float, float], level: str
) -> None:
    assert tuned_model.ENSEMBLE_THRESHOLDS == {"concern": 0.7, "crisis": 0.35}
    model = tuned_model.CrisisEnsemble(_Fixed(*tuned_p), _Fixed(*kernel_p))  # type: ignore[arg-type]
    got, risk, crisis = model.level("anything")
    assert got == level
    assert risk == pytest.approx((tuned_p[0] + kernel_p[0]) / 2)
    assert crisis == pytest.approx((tuned_p[1] + kernel_p[1]) / 2)
    # Served through assess it can only raise the rules' level, never lower it.
    registry.set_model_for_tests(model)  # type: ignore[arg-type]
    assert safety.assess("i am going to kill myself tonight").level == "crisis"


def test_the_plain_chat_gate_silences_the_ensemble_but_never_the_rules() -> None:
    """Where the minilm reader's gate reads plain chat the ensemble adds nothing, however
    sure its readers are; the rules still answer a crisis in plain words."""
    model = tuned_model.CrisisEnsemble(_Fixed(0.99, 0.99), _Fixed(0.99, 0.99, plain=True))  # type: ignore[arg-type]
    got, risk, crisis = model.level("anything")
    assert (got, risk, crisis) == ("none", pytest.approx(0.99), pytest.approx(0.99))
    registry.set_model_for_tests(model)  # type: ignore[arg-type]
    assert safety.assess("how do i make cold brew at home?").level == "none"
    assert safety.assess("i am going to kill myself tonight").level == "crisis"


def test_the_served_gate_reads_plain_chat_as_plain() -> None:
    """The real artifacts: the gate is present and lets a farewell through but silences a
    plain question to the bot."""
    model = registry.get_model()
    assert model is not None and model.encoder == tuned_model.ENSEMBLE
    _, silenced = model.kernel.read(
        ["how do i change the date of my next appointment?", "gave the cat to my sister for good"]
    )
    assert silenced.tolist() == [True, False]


def test_loading_leaves_the_global_random_stream_alone() -> None:
    """The training worker loads the model mid-round (crisis-path check) and the engine
    samples replies: building the network must not move torch's global RNG."""
    import torch

    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    tuned_model._load_cached.cache_clear()
    tuned_model.TunedCrisisModel.load()
    assert torch.equal(torch.rand(3), expected)
