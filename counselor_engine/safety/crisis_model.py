"""The learned second layer of crisis detection: a small logistic model, no LLM.

The rules (:mod:`counselor_engine.safety.matcher`) catch what they were written for; phrasing
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
  On top of the linear score the ``minilm`` model adds a similarity term (:func:`similarity`):
  ``KERNEL_WEIGHT * sum_i alpha_i * exp((cos(e, e_i) - 1) / KERNEL_TAU)`` over the stored
  embeddings ``e_i`` of the training messages. It is the same logistic model with a
  Gaussian kernel on the unit sphere added to the linear one (fitted jointly in the dual,
  :func:`fit_dual`): a soft nearest-neighbour vote, so a message close in meaning to a few
  training statements ("i've rehomed my cat and i'm ready") is pulled towards their label
  even where no single direction in embedding space separates the classes. The weight and
  width were chosen by leave-one-round-out over ``crisis_eval_v2.jsonl`` v2-r1..v2-r5 (train
  on everything else, score the left-out round, as a proxy for text nobody has seen): with
  the round-5 training data, linear alone caught 129/136 indirect statements with 24/321
  false positives, weight 2 and width 0.2 or 0.35 caught 131/136 with 23 and 21/321
  (scripts/train_safety.py has the figures for the final data).
- The ``minilm`` model also has a plain-chat gate (:meth:`CrisisModel.plain`): a logistic
  head over the MiniLM block, trained to tell the plain-chat training rows (greetings,
  questions to the bot, instructions, off-topic requests, ordinary news) from everything
  else. Where it reads plain chat the model stays silent and the rules answer alone. The
  similarity term and the weakly regularised linear part score text unlike any training
  row unpredictably (round 5 flagged "how do i make cold brew at home?" as crisis); the
  gate is the part that has seen such text. Its threshold silences at most 0.5% of the
  training positives out of fold (``scripts/train_safety.py``, ``GATE_POSITIVES``).

- Where transformers and peft import and its artifact exists, what serves is the
  ensemble of :mod:`counselor_engine.safety.tuned_model`: the mean of this ``minilm`` model's
  probabilities and those of MiniLM fine-tuned as a classifier (:func:`registry.get_model`); this
  module's models are its half and the fallbacks (``minilm``, then ``hash``).

The weights are trained by ``scripts/train_safety.py`` from
``data/safety/train_crisis*.jsonl`` plus the tuned splits of ``tests/data/crisis_eval.jsonl``
and the already-scored rounds of ``crisis_eval_v2.jsonl`` (never the :data:`evaluation.HELD_OUT` ones),
and stored in ``data/safety/crisis_model_<encoder>.npz`` with a JSON header naming the
format, the encoder, the thresholds and the sha256 of the training data, so a stale artifact
is detected by a test; ``data/safety/manifest.json`` holds each shipped file's sha256
(:mod:`counselor_engine.safety.artifacts`). The stored training embeddings are int8 with a scale per row
(:func:`quantise`; ~1 MB, and the model is fitted on the dequantised values it serves with).
Training is deterministic (Newton's method from zeros), so rerunning the script gives the
same file.

Cost (bench/bench_safety.py): ``hash`` is a fraction of a millisecond per message; the
MiniLM encoder loads once per process (~4 s; the chat consumer module calls
:func:`registry.warm` in a
thread when the server imports it) and then costs ~7 ms for a chat message and ~50 ms for
2 KB on 2 CPU cores (bench/RESULTS.md, "safety"); the similarity term adds one
(n_train x 384) product, well under a millisecond. A missing or broken artifact
or encoder never stops :func:`safety.assess`: it logs an error and the rules answer alone.

Which model serves, and the process-wide instance, are :mod:`counselor_engine.safety.registry`'s;
the evaluation helpers are :mod:`counselor_engine.safety.evaluation`'s.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from counselor_engine.safety import artifacts

FORMAT = 3
HASH_DIM = 2**14
DENSE_DIM = 384  # the MiniLM block leads every ``minilm`` feature row
# The similarity term of the ``minilm`` model (see the module docstring for how they were
# chosen); the ``hash`` model is linear only.
KERNEL_WEIGHT = 2.0
KERNEL_TAU = 0.35
DATA_DIR = artifacts.SHIPPED_DIR
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


def quantise(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit embeddings as int8 rows and a float32 scale per row (max |value| maps to 127)."""
    top = np.abs(dense).max(axis=1, keepdims=True).astype(np.float32)
    scale = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
    return np.round(dense / scale).astype(np.int8), scale[:, 0]


def dequantise(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (codes.astype(np.float32) * scale[:, None]).astype(np.float32)


def similarity(a: np.ndarray, b: np.ndarray, tau: float = KERNEL_TAU) -> np.ndarray:
    """Gaussian kernel between rows of unit embeddings: ``exp((cos - 1) / tau)``, 1 for the
    same direction, falling with the angle (``exp(-|a - b|^2 / (2 tau))`` on the sphere)."""
    return np.exp((a.astype(np.float64) @ b.T.astype(np.float64) - 1.0) / tau)


# -- the model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CrisisModel:
    """Two logistic heads (``risk``, ``crisis``) over :func:`features`, plus, for the
    ``minilm`` encoder, the similarity term over ``support`` (see the module docstring)."""

    encoder: str
    weights: np.ndarray  # (2, dim) float32: row 0 risk, row 1 crisis
    bias: np.ndarray  # (2,)
    thresholds: dict[str, float]
    meta: dict[str, object]
    # The similarity term: training embeddings (n, DENSE_DIM), as dequantised from int8, and
    # their dual weights (2, n). None for a linear model (the hash encoder).
    support: np.ndarray | None = None
    alpha: np.ndarray | None = None
    # The plain-chat gate (``minilm`` only): logistic weights over the MiniLM block, bias
    # last, (DENSE_DIM + 1,); where P(plain) >= meta["gate"]["threshold"] the model is silent.
    gate: np.ndarray | None = None

    def probabilities(self, norms: Sequence[str]) -> np.ndarray:
        """(n, 2) probabilities [P(>= concern), P(crisis)]."""
        return self.read(norms)[0]

    def read(self, norms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(n, 2) probabilities and (n,) bool: where the plain-chat gate silences the model
        (all False without a gate). One encoding serves both."""
        x = features(norms, self.encoder)
        silenced = np.zeros(x.shape[0], dtype=bool)
        if self.gate is not None:
            silenced = self.plain(x) >= self.gate_threshold
        return sigmoid(self.scores(x)), silenced

    def plain(self, x: np.ndarray) -> np.ndarray:
        """(n,) P(plain chat) for feature rows ``x``; zeros without a gate."""
        if self.gate is None:
            return np.zeros(x.shape[0])
        return sigmoid(x[:, :DENSE_DIM].astype(np.float64) @ self.gate[:-1] + self.gate[-1])

    def scores(self, x: np.ndarray) -> np.ndarray:
        """(n, 2) logits for feature rows ``x``."""
        z = x @ self.weights.T + self.bias
        if self.support is not None and self.alpha is not None:
            kernel = self.meta.get("kernel", {})
            weight, tau = float(kernel["weight"]), float(kernel["tau"])  # type: ignore[index]
            z = z + weight * similarity(x[:, :DENSE_DIM], self.support, tau) @ self.alpha.T
        return z

    def level(self, norm: str) -> tuple[str, float, float]:
        """(level, P(risk), P(crisis)) for one normalised text; "none" when the gate reads
        it as plain chat."""
        return read_one(self.read, norm, self.thresholds)

    @property
    def gate_threshold(self) -> float:
        return float(self.meta["gate"]["threshold"])  # type: ignore[index]

    def save(self, path: Path) -> None:
        header = json.dumps(
            {"format": FORMAT, "encoder": self.encoder, "thresholds": self.thresholds, **self.meta},
            sort_keys=True,
        )
        arrays: dict[str, np.ndarray] = {
            "header": np.frombuffer(header.encode("utf-8"), dtype=np.uint8),
            "weights": self.weights.astype(np.float32),
            "bias": self.bias.astype(np.float32),
        }
        if self.support is not None and self.alpha is not None:
            arrays["support_codes"], arrays["support_scale"] = quantise(self.support)
            arrays["alpha"] = self.alpha.astype(np.float32)
        if self.gate is not None:
            arrays["gate"] = self.gate.astype(np.float32)
        with path.open("wb") as fh:
            np.savez_compressed(fh, **arrays)

    @classmethod
    def shipped(cls, encoder: str) -> CrisisModel:
        """The packaged artifact of ``encoder``, checked against the manifest first
        (:func:`artifacts.verified`)."""
        return cls.load(artifacts.verified(artifact_path(encoder)))

    @classmethod
    def load(cls, path: Path) -> CrisisModel:
        support = alpha = gate = None
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            weights = np.asarray(data["weights"], dtype=np.float32)
            bias = np.asarray(data["bias"], dtype=np.float32)
            if "alpha" in data.files:
                support = dequantise(data["support_codes"], data["support_scale"])
                alpha = np.asarray(data["alpha"], dtype=np.float32)
            if "gate" in data.files:
                gate = np.asarray(data["gate"], dtype=np.float32)
        if header.get("format") != FORMAT:
            raise ValueError(f"{path.name}: format {header.get('format')!r}, expected {FORMAT}")
        encoder = header.pop("encoder")
        thresholds = {k: float(v) for k, v in header.pop("thresholds").items()}
        if weights.shape[0] != 2 or bias.shape != (2,) or set(thresholds) != {"concern", "crisis"}:
            raise ValueError(f"{path.name}: malformed weights or thresholds")
        if support is not None and (
            alpha is None
            or alpha.shape != (2, support.shape[0])
            or support.shape[1] != DENSE_DIM
            or "kernel" not in header
        ):
            raise ValueError(f"{path.name}: malformed similarity term")
        if gate is not None and (gate.shape != (DENSE_DIM + 1,) or "gate" not in header):
            raise ValueError(f"{path.name}: malformed plain-chat gate")
        header.pop("format")
        return cls(encoder, weights, bias, thresholds, header, support, alpha, gate)


def level_for(risk: float, crisis: float, thresholds: Mapping[str, float]) -> str:
    """The level two head probabilities reach: crisis first, then concern, else none."""
    if crisis >= thresholds["crisis"]:
        return "crisis"
    return "concern" if risk >= thresholds["concern"] else "none"


Reader = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]


def read_one(read: Reader, norm: str, thresholds: Mapping[str, float]) -> tuple[str, float, float]:
    """(level, P(risk), P(crisis)) of one normalised text from a reader's ``read``
    (probabilities and where the plain-chat gate silences it): "none" where silenced."""
    probabilities, silenced = read([norm])
    risk, crisis = (float(v) for v in probabilities[0])
    return ("none" if silenced[0] else level_for(risk, crisis, thresholds)), risk, crisis


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function, clipped so large scores never overflow."""
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


def fit_logistic(
    x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, iterations: int = 30
) -> tuple[np.ndarray, float]:
    """Class-balanced L2 logistic regression on feature rows ``x``: (weights, bias).

    The bias is a constant feature (lightly regularised with the rest); solved by
    :func:`fit_dual` on the linear kernel ``x x^T + 1``.
    """
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError("fit_logistic: x must be (n, d) and y a (n,) array of 0/1")
    xa = x.astype(np.float64)
    alpha = fit_dual(xa @ xa.T + 1.0, y, l2=l2, iterations=iterations)
    return (xa.T @ alpha).astype(np.float32), float(alpha.sum())


def fit_dual(
    kernel: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, iterations: int = 30
) -> np.ndarray:
    """Class-balanced L2 logistic regression in the dual: the ``alpha`` with scores
    ``kernel @ alpha``, by Newton's method.

    With fewer examples than features the weights lie in the span of the examples,
    ``w = X^T a``, so each Newton step solves an (n x n) system instead of (d x d); any
    positive semi-definite kernel (the linear one plus :func:`similarity`) fits the same
    way. Positives and negatives weigh the same in the loss whatever their counts.
    Deterministic: no random start, no shuffling, which is what makes the artifact
    reproducible. The caller computes the kernel once and passes sub-blocks for folds.
    """
    n = kernel.shape[0] if kernel.ndim == 2 else -1
    if kernel.shape != (n, n) or y.shape != (n,) or not set(np.unique(y)) <= {0.0, 1.0}:
        raise ValueError("fit_dual: kernel must be (n, n) and y a (n,) array of 0/1")
    y = y.astype(np.float64)
    pos = max(float(y.sum()), 1.0)
    neg = max(float(len(y) - y.sum()), 1.0)
    s = np.where(y == 1, 0.5 / pos, 0.5 / neg)
    kernel = kernel.astype(np.float64)
    alpha = np.zeros(len(y))

    def objective(a: np.ndarray) -> float:
        f = kernel @ a
        losses = np.logaddexp(0.0, f) - y * f
        return float(s @ losses + 0.5 * l2 * a @ f)

    current = objective(alpha)
    for _ in range(iterations):
        p = sigmoid(kernel @ alpha)
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
    return alpha


def training_digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()
