"""Model backends: one async protocol (:class:`Backend`), two implementations.

``make_backend("transformers", model_path=...)`` runs a model in-process (CPU default);
``make_backend("vllm", base_url=..., model=...)`` talks to a vLLM server. Implementations
are imported lazily so that importing the protocol costs neither torch nor an HTTP client.
"""

from __future__ import annotations

from typing import Any

from .base import (
    Backend,
    BackendError,
    ChatMessage,
    GenerationParams,
    Prompt,
    Role,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

__all__ = [
    "BACKEND_KINDS",
    "Backend",
    "BackendError",
    "ChatMessage",
    "GenerationParams",
    "Prompt",
    "Role",
    "StreamDelta",
    "StreamDone",
    "StreamEvent",
    "make_backend",
]

BACKEND_KINDS = ("transformers", "vllm")


def make_backend(kind: str, **kwargs: Any) -> Backend:
    """Build the backend named ``kind`` ("transformers" | "vllm") from keyword settings."""
    if kind == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if kind == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(**kwargs)
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {BACKEND_KINDS}")
