"""The learned second layer of crisis detection: a small logistic model, no LLM.

The rules in :mod:`counselor_engine.safety` catch what they were written for; phrasing
nobody anticipated ("i've worked out which pills and how many") slips through. This layer
scores every message with two logistic heads over text features and can only *raise* the
rules' level, never lower it:

- ``risk``: P(level >= concern); above ``thresholds["concern"]`` the message is concern.
- ``crisis``: P(level == crisis); above ``thresholds["crisis"]`` it is crisis.

Features (:func:`features`), chosen by cross-validation on the training set only:

- ``hash``: word unigrams and bigrams of :func:`safety.normalise`'s output (so leetspeak,
  misspellings and chat shorthand are already folded) plus character 3-5-grams of each
  word, hashed with CRC-32 into ``2**14`` signed buckets, L2-normalised. Pure Python.
- ``minilm``: all-MiniLM-L6-v2 sentence embedding of the normalised text
  (:mod:`counselor_engine.embeddings`), concatenated with the hashed features. Used when the
  packaged model is importable; it understands paraphrase, which indirect statements are.

The weights are trained by ``scripts/train_safety.py`` from
``data/safety/train_crisis.jsonl`` plus the tuned splits of ``tests/data/crisis_eval.jsonl``
and the already-scored rounds of ``crisis_eval_v2.jsonl`` (never the :data:`HELD_OUT` ones),
and stored in ``data/safety/crisis_model_<encoder>.npz`` with a JSON header naming the
format, the encoder, the thresholds and the sha256 of the training data, so a stale artifact
is detected by a test. Training is deterministic (full-batch gradient descent from zeros),
so rerunning the script gives the same file.

Cost (bench/bench_safety.py): ``hash`` is a fraction of a millisecond per message; the
MiniLM encoder loads once per process (~4 s; the chat consumer module calls :func:`warm` in a
thread when the server imports it) and then costs ~7 ms for a chat message and ~50 ms for
2 KB on 2 CPU cores (bench/RESULTS.md, "safety"). A missing or broken artifact
or encoder never stops :func:`safety.assess`: it logs an error and the rules answer alone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

FORMAT = 1
HASH_DIM = 2**14
DATA_DIR = Path(__file__).resolve().parent / "data" / "safety"
ENCODERS = ("hash", "minilm")


def artifact_path(encoder: str) -> Path:
    if encoder not in ENCODERS:
        raise ValueError(f"encoder: expected one of {ENCODERS}, got {encoder!r}")
    return DATA_DIR / f"crisis_model_{encoder}.npz"


# -- features ------------------------------------------------------------------------------


def _bucket(feature: str) -> tuple[int, float]:
    value = zlib.crc32(feature.encode("utf-8"))
    return value % HASH_DIM, 1.0 if value & 0x80000000 else -1.0


def hashed(norm: str) -> np.ndarray:
    """Signed hashed n-grams of an already normalised text, as a unit float32 row."""
    row = np.zeros(HASH_DIM, dtype=np.float32)
    words = [w for w in norm.replace(".", " ").replace("!", " ").replace("?", " ").split() if w]
    feats: list[tuple[str, float]] = [("w:" + w, 1.0) for w in words]
    feats += [("b:" + a + "_" + b, 1.0) for a, b in itertools.pairwise(words)]
    for w in words:
        padded = f"<{w}>"
        for n in (3, 4, 5):
            feats += [("c:" + padded[i : i + n], 0.3) for i in range(len(padded) - n + 1)]
    for feature, weight in feats:
        index, sign = _bucket(feature)
        row[index] += sign * weight
    norm2 = float(np.linalg.norm(row))
    return row / norm2 if norm2 > 0 else row


def features(norms: Sequence[str], encoder: str) -> np.ndarray:
    """The model's input rows for normalised texts (see the module docstring)."""
    rows = np.stack([hashed(t) for t in norms]) if norms else np.zeros((0, HASH_DIM), np.float32)
    if encoder == "hash":
        return rows
    if encoder == "minilm":
        from counselor_engine.embeddings import MiniLMEmbedder

        dense = MiniLMEmbedder().embed(list(norms))
        return np.concatenate([dense, rows], axis=1).astype(np.float32)
    raise ValueError(f"encoder: expected one of {ENCODERS}, got {encoder!r}")


# -- the model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CrisisModel:
    """Two logistic heads (``risk``, ``crisis``) over :func:`features`."""

    encoder: str
    weights: np.ndarray  # (2, dim) float32: row 0 risk, row 1 crisis
    bias: np.ndarray  # (2,)
    thresholds: dict[str, float]
    meta: dict[str, object]

    def probabilities(self, norms: Sequence[str]) -> np.ndarray:
        """(n, 2) probabilities [P(>= concern), P(crisis)]."""
        x = features(norms, self.encoder)
        return _sigmoid(x @ self.weights.T + self.bias)

    def level(self, norm: str) -> tuple[str, float, float]:
        """(level, P(risk), P(crisis)) for one normalised text."""
        risk, crisis = (float(v) for v in self.probabilities([norm])[0])
        if crisis >= self.thresholds["crisis"]:
            return "crisis", risk, crisis
        if risk >= self.thresholds["concern"]:
            return "concern", risk, crisis
        return "none", risk, crisis

    def save(self, path: Path) -> None:
        header = json.dumps(
            {"format": FORMAT, "encoder": self.encoder, "thresholds": self.thresholds, **self.meta},
            sort_keys=True,
        )
        with path.open("wb") as fh:
            np.savez_compressed(
                fh,
                header=np.frombuffer(header.encode("utf-8"), dtype=np.uint8),
                weights=self.weights.astype(np.float32),
                bias=self.bias.astype(np.float32),
            )

    @classmethod
    def load(cls, path: Path) -> CrisisModel:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            weights = np.asarray(data["weights"], dtype=np.float32)
            bias = np.asarray(data["bias"], dtype=np.float32)
        if header.get("format") != FORMAT:
            raise ValueError(f"{path.name}: format {header.get('format')!r}, expected {FORMAT}")
        encoder = header.pop("encoder")
        thresholds = {k: float(v) for k, v in header.pop("thresholds").items()}
        if weights.shape[0] != 2 or bias.shape != (2,) or set(thresholds) != {"concern", "crisis"}:
            raise ValueError(f"{path.name}: malformed weights or thresholds")
        header.pop("format")
        return cls(encoder, weights, bias, thresholds, header)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


def fit_logistic(
    x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, iterations: int = 30
) -> tuple[np.ndarray, float]:
    """Class-balanced L2 logistic regression, solved by Newton's method in the dual.

    With fewer examples than features the weights lie in the span of the examples,
    ``w = X^T a``, so each Newton step solves an (n x n) system instead of (d x d). The
    bias is a constant feature (lightly regularised with the rest). Positives and
    negatives weigh the same in the loss whatever their counts. Deterministic: no random
    start, no shuffling, which is what makes the artifact reproducible.
    """
    if x.ndim != 2 or y.shape != (x.shape[0],) or not set(np.unique(y)) <= {0.0, 1.0}:
        raise ValueError("fit_logistic: x must be (n, d) and y a (n,) array of 0/1")
    y = y.astype(np.float64)
    pos = max(float(y.sum()), 1.0)
    neg = max(float(len(y) - y.sum()), 1.0)
    s = np.where(y == 1, 0.5 / pos, 0.5 / neg)
    xa = np.concatenate([x.astype(np.float64), np.ones((x.shape[0], 1))], axis=1)
    kernel = xa @ xa.T
    alpha = np.zeros(len(y))

    def objective(a: np.ndarray) -> float:
        f = kernel @ a
        losses = np.logaddexp(0.0, f) - y * f
        return float(s @ losses + 0.5 * l2 * a @ kernel @ a)

    current = objective(alpha)
    for _ in range(iterations):
        p = _sigmoid(kernel @ alpha)
        hess = (s * p * (1 - p))[:, None] * kernel + l2 * np.eye(len(y))
        step = np.linalg.solve(hess, s * (p - y) + l2 * alpha)
        scale = 1.0
        while scale > 1e-4:  # backtracking: a full Newton step can overshoot far from 0
            candidate = alpha - scale * step
            value = objective(candidate)
            if value <= current:
                break
            scale /= 2
        else:
            break
        done = current - value < 1e-10
        alpha, current = candidate, value
        if done:
            break
    full = xa.T @ alpha
    return full[:-1].astype(np.float32), float(full[-1])


def training_digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


# -- process-wide instance -----------------------------------------------------------------

_LOCK = threading.Lock()
_MODEL: list[CrisisModel | None] = []


def preferred_encoder() -> str:
    from counselor_engine.embeddings import minilm_available

    return "minilm" if minilm_available() and artifact_path("minilm").exists() else "hash"


def get_model() -> CrisisModel | None:
    """The loaded model, or None when no artifact loads (logged once; rules answer alone)."""
    if _MODEL:
        return _MODEL[0]
    with _LOCK:
        if not _MODEL:
            model: CrisisModel | None = None
            try:
                model = CrisisModel.load(artifact_path(preferred_encoder()))
            except Exception:
                log.exception("crisis model unavailable; safety rules answer alone")
            _MODEL.append(model)
    return _MODEL[0]


def _forget_verdicts() -> None:
    from counselor_engine import safety

    safety._learned.cache_clear()


def set_model_for_tests(model: CrisisModel | None) -> None:
    """Serve ``model`` (None: no model, the rules answer alone) until :func:`reset`."""
    with _LOCK:
        _MODEL.clear()
        _MODEL.append(model)
    _forget_verdicts()


def reset() -> None:
    """Forget the loaded model; the next message loads the artifact again."""
    with _LOCK:
        _MODEL.clear()
    _forget_verdicts()


def warm() -> None:
    """Load the artifact and the encoder now, so the first client message does not wait."""
    model = get_model()
    if model is None:
        return
    try:
        model.probabilities(["warm up"])
    except Exception:  # the encoder failed: assess will log and fall back per message
        log.exception("crisis model could not warm up")


# -- evaluation ----------------------------------------------------------------------------

EVAL_DIR = Path(__file__).resolve().parent / "tests" / "data"
_RANK = {"none": 0, "concern": 1, "crisis": 2}
# Splits never trained on, per labelled file: their figures are the honest ones. v2-r5 was
# written before the round-4 model existed; ``heldout`` is the older set's untuned split.
HELD_OUT: dict[str, tuple[str, ...]] = {
    "crisis_eval_v2.jsonl": ("v2-r5",),
    "crisis_eval.jsonl": ("heldout",),
}


def labelled(name: str, splits: Sequence[str] | None = None) -> list[dict[str, str]]:
    """Rows of a labelled file in ``tests/data`` (optionally only some splits)."""
    rows = [json.loads(line) for line in (EVAL_DIR / name).read_text("utf-8").splitlines() if line]
    return [r for r in rows if splits is None or r["split"] in splits]


def figures(
    rows: Sequence[dict[str, str]], assess: Callable[[str], object]
) -> dict[str, list[int]]:
    """Counts [hits, total] per kind of positive; ``flagged`` (any level on a positive) and
    ``fp`` (negatives flagged at concern or crisis). A positive is recalled when the
    assessed level is at least its label. Machine-readable for docs/reliability.md."""
    out: dict[str, list[int]] = {}
    for row in rows:
        got = assess(row["text"]).level  # type: ignore[attr-defined]
        if row["level"] == "none":
            keys = [("fp", got != "none")]
        else:
            keys = [(row["kind"], _RANK[got] >= _RANK[row["level"]]), ("flagged", got != "none")]
        for key, hit in keys:
            cell = out.setdefault(key, [0, 0])
            cell[0] += int(hit)
            cell[1] += 1
    return out


def figures_by_split(
    rows: Sequence[dict[str, str]], assess: Callable[[str], object]
) -> dict[str, dict[str, list[int]]]:
    """:func:`figures` per split, so a held-out round is never pooled with trained ones."""
    splits: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        splits.setdefault(row["split"], []).append(row)
    return {split: figures(part, assess) for split, part in splits.items()}


def held_out_figures(assess: Callable[[str], object]) -> dict[str, dict[str, list[int]]]:
    """Figures of every :data:`HELD_OUT` split, keyed ``"<file>:<split>"``."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, splits in HELD_OUT.items():
        for split, figs in figures_by_split(labelled(name, splits), assess).items():
            out[f"{name}:{split}"] = figs
    return out
