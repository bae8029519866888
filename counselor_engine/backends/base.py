"""The one protocol every model backend implements.

The engine talks to models only through :class:`Backend`. Two implementations exist:
``transformers`` (in-process, CPU default) and ``vllm`` (an OpenAI-compatible server: the
production engine, GPU or vLLM's CPU build). Everything here is plain data so the judge,
the counselor and the training worker never depend on which backend serves them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str


Prompt = Sequence[ChatMessage]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings for one batched generation call."""

    max_new_tokens: int = 128
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int | None = None


@dataclass(frozen=True)
class StreamDelta:
    """A piece of text appended to candidate ``index`` while generation runs."""

    index: int
    text: str


@dataclass(frozen=True)
class StreamDone:
    """Generation finished: the full text of every candidate, in index order."""

    texts: list[str] = field(default_factory=list)


StreamEvent = StreamDelta | StreamDone


class BackendError(RuntimeError):
    """The backend could not serve a request (down, timed out, bad adapter, ...)."""


@runtime_checkable
class Backend(Protocol):
    """Async model access used by the engine.

    Implementations must be safe to call from one asyncio loop; blocking work runs in a
    worker thread. ``adapter`` names a LoRA adapter previously made known with
    :meth:`load_adapter`; ``None`` means the base model.
    """

    name: str

    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        """Sample ``n`` candidates for one chat prompt in ONE batched call."""
        ...

    def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Like :meth:`generate`, yielding deltas of candidate 0 as they are written
        (other candidates may or may not stream) and a final :class:`StreamDone`."""
        ...

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        """For each prompt, the next-token probability of each choice string (e.g. "A",
        "B" or "1".."5") at the start of the assistant reply, renormalised over the
        choices. All prompts go to the model batched. Never parses free text."""
        ...

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        """Sum of log-probabilities of each response's tokens given its prompt (response
        tokens only; the prompt is masked out)."""
        ...

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        """Make a LoRA adapter servable under ``name`` (idempotent).

        ``sha256`` (optional): the approved digest of the folder's files
        (:func:`~counselor_engine.backends.adapter_files.files_digest`). A backend that
        reads the files itself checks it right before reading and raises
        :class:`~counselor_engine.backends.adapter_files.AdapterRefused` on a mismatch."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Forget a previously loaded adapter (idempotent)."""
        ...
