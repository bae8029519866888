"""The one place that knows which learned reader serves, and the process-wide instance.

Readers: the tuned ensemble (:mod:`counselor_engine.safety.tuned_model`) where transformers,
peft and its artifact are there, else the ``minilm`` linear + similarity model, else the
``hash`` one (:mod:`counselor_engine.safety.crisis_model`). Fusion
(:mod:`counselor_engine.safety.fusion`) asks :func:`verdict` and nothing else; the verdict
cache lives here, next to the model it caches, so swapping the model clears it.

The readers are imported when first needed: importing :mod:`counselor_engine.safety` for the
rules never pulls numpy or torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from counselor_engine.safety.assessment import Level

log = logging.getLogger(__name__)


class CrisisReader(Protocol):
    """What serving needs from a learned reader (``CrisisModel``, ``CrisisEnsemble``)."""

    encoder: str
    thresholds: dict[str, float]

    @property
    def meta(self) -> dict[str, object]: ...

    def probabilities(self, norms: Sequence[str]) -> Any: ...

    def level(self, norm: str) -> tuple[str, float, float]: ...


_LOCK = threading.Lock()
_MODEL: list[CrisisReader | None] = []


def preferred_encoder() -> str:
    """``ensemble`` (:mod:`counselor_engine.safety.tuned_model`) where the tuned classifier
    can load, else ``minilm``, else ``hash``."""
    from counselor_engine.embeddings import minilm_available
    from counselor_engine.safety import crisis_model, tuned_model

    if not (minilm_available() and crisis_model.artifact_path("minilm").exists()):
        return "hash"
    tuned = tuned_model.available() and tuned_model.ARTIFACT.exists()
    return tuned_model.ENSEMBLE if tuned else "minilm"


def _load_preferred() -> CrisisReader:
    from counselor_engine.safety import crisis_model, tuned_model

    encoder = preferred_encoder()
    if encoder == tuned_model.ENSEMBLE:
        try:
            return tuned_model.CrisisEnsemble.load()
        except Exception:
            log.exception("tuned crisis model unavailable; the minilm model serves alone")
            encoder = "minilm"
    return crisis_model.CrisisModel.shipped(encoder)


def get_model() -> CrisisReader | None:
    """The loaded model (:func:`preferred_encoder`), or None when no artifact loads (logged
    once; rules answer alone)."""
    if _MODEL:
        return _MODEL[0]
    with _LOCK:
        if not _MODEL:
            model: CrisisReader | None = None
            try:
                model = _load_preferred()
            except Exception:
                log.exception("crisis model unavailable; safety rules answer alone")
            _MODEL.append(model)
    return _MODEL[0]


@lru_cache(maxsize=512)
def verdict(norm: str) -> tuple[Level, float, float] | None:
    """The served model's (level, P(risk), P(crisis)) on a normalised text, or None with no
    model. Cached: the consumer and the engine both assess each message. May raise (the
    encoder failed); the caller decides what then answers."""
    model = get_model()
    if model is None:
        return None
    level, risk, crisis = model.level(norm)
    return level, risk, crisis  # type: ignore[return-value]


def set_model_for_tests(model: CrisisReader | None) -> None:
    """Serve ``model`` (None: no model, the rules answer alone) until :func:`reset`."""
    with _LOCK:
        _MODEL.clear()
        _MODEL.append(model)
    verdict.cache_clear()


def reset() -> None:
    """Forget the loaded model; the next message loads the artifact again."""
    with _LOCK:
        _MODEL.clear()
    verdict.cache_clear()


def warm() -> None:
    """Load the artifact and the encoder now, so the first client message does not wait."""
    model = get_model()
    if model is None:
        return
    try:
        model.probabilities(["warm up"])
    except Exception:  # the encoder failed: assess will log and fall back per message
        log.exception("crisis model could not warm up")
