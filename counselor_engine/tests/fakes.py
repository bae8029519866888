"""A scripted, in-memory :class:`~counselor_engine.backends.base.Backend` for tests.

Reuse it for memory, judge and counselor tests: it implements the whole protocol, needs
no model, and records every call.

Scripting (each queue is consumed in order; when it runs dry the default applies):

- ``script_texts(*texts)``: candidate texts, one per candidate, across ``generate`` and
  ``generate_stream`` calls. Default: ``responder(prompt, index)``, which returns
  ``"fake reply {call}.{index}"`` unless another responder is given.
- ``script_probabilities(*rows)``: one row per prompt for ``choice_probabilities``; rows
  are renormalised over the choices as the protocol promises. Default: uniform.
- ``script_logprobs(*values)``: one value per response for ``sequence_logprobs``.
  Default: minus the number of whitespace-separated words.
- ``fail_next(method, error=None, times=1)`` / ``fail_always(method, error=None)``: raise
  (a :class:`BackendError` unless given) from ``method``, or from every method with "*".
- ``delay``: seconds each call sleeps first (for timeout tests).

Inspection: ``calls`` (a Counter by method), ``log`` (method and arguments, in order),
``prompts`` (every prompt seen by ``generate``/``generate_stream``/``choice_probabilities``/
``sequence_logprobs``), ``adapters`` (name -> path, from ``load_adapter``).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from counselor_engine.backends.base import (
    BackendError,
    GenerationParams,
    Prompt,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

Responder = Callable[[Prompt, int], str]


class FakeBackend:
    """Implements the Backend protocol with scripted answers; see the module docstring."""

    def __init__(
        self,
        texts: Sequence[str] = (),
        *,
        name: str = "fake",
        responder: Responder | None = None,
        delay: float = 0.0,
    ) -> None:
        self.name = name
        self.delay = delay
        self.responder: Responder = responder or self._default_reply
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.prompts: list[Prompt] = []
        self.adapters: dict[str, str] = {}
        self._texts: deque[str] = deque(texts)
        self._probabilities: deque[Sequence[float]] = deque()
        self._logprobs: deque[float] = deque()
        self._failures: dict[str, deque[BaseException]] = {}
        self._always: dict[str, BaseException] = {}

    # -- scripting -------------------------------------------------------------------------
    def script_texts(self, *texts: str) -> FakeBackend:
        self._texts.extend(texts)
        return self

    def script_probabilities(self, *rows: Sequence[float]) -> FakeBackend:
        self._probabilities.extend(rows)
        return self

    def script_logprobs(self, *values: float) -> FakeBackend:
        self._logprobs.extend(values)
        return self

    def fail_next(
        self, method: str = "*", error: BaseException | None = None, times: int = 1
    ) -> FakeBackend:
        queue = self._failures.setdefault(method, deque())
        queue.extend([error or BackendError(f"fake {method} failure")] * times)
        return self

    def fail_always(self, method: str = "*", error: BaseException | None = None) -> FakeBackend:
        self._always[method] = error or BackendError(f"fake {method} is down")
        return self

    def recover(self) -> FakeBackend:
        """Forget every scripted failure."""
        self._failures.clear()
        self._always.clear()
        return self

    # -- internals -------------------------------------------------------------------------
    def _default_reply(self, prompt: Prompt, index: int) -> str:
        return f"fake reply {self.calls['generate'] + self.calls['generate_stream']}.{index}"

    async def _enter(self, method: str, **kwargs: Any) -> None:
        self.calls[method] += 1
        self.log.append((method, kwargs))
        if self.delay:
            await asyncio.sleep(self.delay)
        for key in (method, "*"):
            if key in self._always:
                raise self._always[key]
            queue = self._failures.get(key)
            if queue:
                raise queue.popleft()

    def _candidates(self, prompt: Prompt, n: int) -> list[str]:
        if n < 1:
            raise BackendError(f"n must be >= 1, got {n}")
        return [
            self._texts.popleft() if self._texts else self.responder(prompt, i) for i in range(n)
        ]

    # -- the protocol ----------------------------------------------------------------------
    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        await self._enter("generate", prompt=prompt, n=n, params=params, adapter=adapter)
        self.prompts.append(prompt)
        return self._candidates(prompt, n)

    async def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        await self._enter("generate_stream", prompt=prompt, n=n, params=params, adapter=adapter)
        self.prompts.append(prompt)
        texts = self._candidates(prompt, n)
        # Word-sized pieces whose concatenation is exactly candidate 0.
        for piece in re.split(r"(?<=\s)(?=\S)", texts[0]):
            if piece:
                yield StreamDelta(0, piece)
        yield StreamDone(texts)

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        await self._enter("choice_probabilities", prompts=prompts, choices=choices, adapter=adapter)
        self.prompts.extend(prompts)
        rows = []
        for _ in prompts:
            row = (
                list(self._probabilities.popleft()) if self._probabilities else [1.0] * len(choices)
            )
            if len(row) != len(choices):
                raise BackendError(f"scripted row {row} does not match choices {list(choices)}")
            total = sum(row)
            rows.append(
                [p / total for p in row] if total > 0 else [1.0 / len(choices)] * len(choices)
            )
        return rows

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        await self._enter(
            "sequence_logprobs", prompts=prompts, responses=responses, adapter=adapter
        )
        self.prompts.extend(prompts)
        return [
            self._logprobs.popleft() if self._logprobs else -float(len(r.split()))
            for r in responses
        ]

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        await self._enter("load_adapter", name=name, path=path, sha256=sha256)
        self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        await self._enter("unload_adapter", name=name)
        self.adapters.pop(name, None)
