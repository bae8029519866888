"""In-process backend on transformers: the CPU default (SmolLM2-135M-Instruct) and any local
model folder.

Prompts are rendered with the model's own chat template (``add_generation_prompt=True``).
The backend never inserts a system message: callers always send their own, because some
templates (SmolLM2's among them) silently add a default one when it is missing.

``choice_probabilities`` computes each token prefix its prompts share once and reuses its
KV cache for what follows (:func:`prefix_tree`): the judge's pairwise prompts all share the
system prompt and conversation, and 12 at a time everything but the criterion line.

Blocking torch work runs in a worker thread (``asyncio.to_thread``) behind a gate that
admits ``max_concurrency`` calls at once, but only calls that agree on the adapter: the
active peft adapter is state of the one shared model, so a call for another adapter
waits until the model is free.

A call whose caller goes away (the turn superseded by a crisis, the session ended, the
backend timeout, the model process told to cancel) stops its torch work: ``generate`` at
its next step, scoring before its next batch. Without that, an abandoned graph-mode reply
kept both cores busy for minutes in a measured browser session, ahead of the next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    StaticCache,
    StoppingCriteria,
)
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer
from transformers.generation.streamers import BaseStreamer

from counselor_engine.torchkit import (
    PrefixNode,
    decoder_and_head,
    pair_ids,
    prefix_tree,
    render_prompt,
    response_logprobs,
)

from .adapter_files import verify_adapter
from .base import (
    Backend,
    BackendError,
    GenerationParams,
    Prompt,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

__all__ = ["IncrementalDecoder", "TransformersBackend"]

# A computed prefix that segments continue: (cache, its row, that row's attention mask,
# the prefix's count of real tokens).
_Context = tuple[DynamicCache, int, torch.Tensor, int]
# Leaf batches (shared-prefix scoring): at most this many rows, and padding at most this share
# of a batch's tokens.
_LEAF_ROWS = 48
_LEAF_PADDING = 0.1
# Response positions projected onto the vocabulary at once: 1024 x 49,152 float32 logits
# (SmolLM2) are 200 MB.
_HEAD_POSITIONS = 1024


def _length_batches(segments: list[list[int]]) -> list[list[int]]:
    """Indices of ``segments``, longest first, cut into batches of at most ``_LEAF_ROWS``
    rows whose left padding (to the batch's longest row) is at most ``_LEAF_PADDING`` of
    its tokens: as large as the padding allows, since bigger matrices run faster per token
    on CPU."""
    batches: list[list[int]] = []
    longest = real = 0
    for index in sorted(range(len(segments)), key=lambda k: -len(segments[k])):
        size = len(segments[index])
        full = not batches or len(batches[-1]) >= _LEAF_ROWS
        if full or real + size < (1 - _LEAF_PADDING) * longest * (len(batches[-1]) + 1):
            batches.append([])
            longest, real = size, 0
        batches[-1].append(index)
        real += size
    return batches


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per row of ``logits`` ``[positions, vocab]``, in float32."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _renormalised(logits: torch.Tensor, choice_ids: list[int]) -> torch.Tensor:
    """The choices' probabilities ``[rows, k]`` under the full softmax, scaled to sum to 1."""
    probs = torch.softmax(logits.float(), dim=-1)[:, choice_ids]
    return (probs / probs.sum(dim=-1, keepdim=True)).cpu()


class IncrementalDecoder:
    """Turns a growing list of token ids into stable text deltas.

    Decoding token by token splits multi-byte characters (byte-level BPE) into replacement
    characters that later resolve; we re-decode the whole sequence and emit only text that
    can no longer change: never a trailing U+FFFD, and only while the new decoding still
    starts with what was already emitted. ``finish`` flushes the rest, so the deltas always
    add up to the final decoding.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self.emitted = ""

    def _decode(self) -> str:
        return str(self._tokenizer.decode(self._ids, skip_special_tokens=True))

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        stable = self._decode().rstrip("\ufffd")
        if len(stable) <= len(self.emitted) or not stable.startswith(self.emitted):
            return ""
        delta = stable[len(self.emitted) :]
        self.emitted = stable
        return delta

    def finish(self) -> str:
        text = self._decode()
        if not text.startswith(self.emitted):  # a decoder that rewrote its past: cannot undo
            return ""
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta


class _RowZeroStreamer(BaseStreamer):
    """Receives the batch's new token ids each step from ``generate`` and forwards stable
    text of row 0 (candidate 0) through ``on_text``. The first ``put`` is the prompt."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], on_text: Callable[[str], None]):
        self._decoder = IncrementalDecoder(tokenizer)
        self._eos_ids = eos_ids
        self._on_text = on_text
        self._prompt_seen = False
        self._finished = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self._finished:
            return
        tokens = value[0].tolist() if value.dim() > 1 else value.reshape(-1)[:1].tolist()
        for token in tokens:
            if token in self._eos_ids:
                # Row 0 is done; later steps only carry padding for it.
                self._finished = True
                return
            if delta := self._decoder.push(int(token)):
                self._on_text(delta)

    def end(self) -> None:
        if delta := self._decoder.finish():
            self._on_text(delta)


class _CallCancelled(Exception):
    """Raised inside a worker thread whose call was cancelled (see :func:`_check_cancelled`)."""


_T = TypeVar("_T")

# The cancel event of the call the current worker thread runs (:meth:`_in_thread`).
_current = threading.local()


def _cancel_event() -> threading.Event | None:
    return getattr(_current, "cancel", None)


@contextlib.contextmanager
def _cancelled_by(event: threading.Event) -> Iterator[None]:
    """Within it, this worker thread's torch work stops once ``event`` is set."""
    _current.cancel = event
    try:
        yield
    finally:
        _current.cancel = None


def _check_cancelled() -> None:
    """Between two pieces of torch work: stop if this thread's call was cancelled."""
    event = _cancel_event()
    if event is not None and event.is_set():
        raise _CallCancelled


class _Cancelled(StoppingCriteria):
    """Stops ``generate`` early once its call is cancelled (a stream's consumer gone, or
    the caller of a plain call)."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self._event.is_set(), dtype=torch.bool)


class _ModelGate:
    """Admits up to ``limit`` concurrent calls that share one adapter state (``key``);
    ``exclusive`` calls (seeded sampling, adapter loading) run alone."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("max_concurrency must be >= 1")
        self._limit = limit
        self._cond = threading.Condition()
        self._active = 0
        self._key: object = None
        self._exclusive = False

    @contextlib.contextmanager
    def hold(self, key: object, *, exclusive: bool = False) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._active == 0
                    or (
                        not exclusive
                        and not self._exclusive
                        and self._active < self._limit
                        and self._key == key
                    )
                )
            )
            self._active += 1
            self._key = key
            self._exclusive = exclusive
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._exclusive = False
                self._cond.notify_all()


_ALL_ADAPTERS = object()  # gate key for adapter loading: must not share the model with anyone
_UNKNOWN = object()  # adapter state after loading/unloading: set it again before use


class TransformersBackend(Backend):
    """The in-process backend. See the module docstring for threading and prompts."""

    name = "transformers"

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_concurrency: int = 1,
        num_threads: int | None = None,
    ) -> None:
        # torch's intra-op thread count is process-wide; None leaves it alone. On a small
        # shared CPU (web server + worker + this) fewer threads than cores can be much
        # faster: a busy core stalls every parallel region of a multi-threaded forward.
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_path = Path(model_path)
        self._device = torch.device(device)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
            base: Any = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load model from {self.model_path}: {exc}") from exc
        if self._tokenizer.pad_token_id is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._model: Any = base.to(self._device).eval()
        self._eos_ids = self._collect_eos_ids()
        # Shared prefixes (choice_probabilities) copy plain per-token KV layers between
        # cache rows and leave masked holes inside them: sound for full attention, not
        # for sliding-window or recurrent layers, whose models take the plain path.
        self._prefix_sharing = all(
            type(layer) is DynamicLayer for layer in DynamicCache(config=base.config).layers
        )
        self._adapters: dict[str, str] = {}  # name -> path
        self._gate = _ModelGate(max_concurrency)
        self._state_lock = threading.Lock()
        self._state: object = _UNKNOWN  # adapter the model is currently set up for

    # -- public helpers -------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The underlying (possibly peft-wrapped) model, e.g. for the trainer."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapters, name -> path."""
        return dict(self._adapters)

    # -- protocol ---------------------------------------------------------------------------

    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        self._check_adapter(adapter)
        return await self._in_thread(self._generate_blocking, prompt, n, params, adapter, None)

    async def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """See :meth:`Backend.generate_stream`. Closing the generator early (``aclose``,
        or ``contextlib.aclosing``) stops the generation at its next step and returns
        once it has stopped."""
        self._check_adapter(adapter)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        cancel = threading.Event()

        def emit(item: StreamEvent | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            streamer = _RowZeroStreamer(
                self._tokenizer, self._eos_ids, lambda text: emit(StreamDelta(0, text))
            )
            try:
                with _cancelled_by(cancel):
                    texts = self._generate_blocking(prompt, n, params, adapter, streamer)
                emit(StreamDone(texts))
            except BaseException as exc:  # forwarded to the consumer, re-raised there
                emit(exc)

        worker = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, StreamDone):
                    return
        finally:
            # A consumer that stops early ends the generation at its next step; waiting
            # for that means the model is free again once aclose() returns.
            cancel.set()
            await worker  # never raises: work() forwards its errors through the queue

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        self._check_adapter(adapter)
        choice_ids = self._choice_token_ids(choices)
        if not prompts:
            return []
        return await self._in_thread(self._choice_blocking, list(prompts), choice_ids, adapter)

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        self._check_adapter(adapter)
        if len(prompts) != len(responses):
            raise ValueError("prompts and responses differ in length")
        if not prompts:
            return []
        return await self._in_thread(
            self._logprobs_blocking, list(prompts), list(responses), adapter
        )

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        await asyncio.to_thread(self._load_adapter_blocking, name, str(path), sha256)

    async def unload_adapter(self, name: str) -> None:
        await asyncio.to_thread(self._unload_adapter_blocking, name)

    # -- blocking work (worker threads) -------------------------------------------------

    def _generate_blocking(
        self,
        prompt: Prompt,
        n: int,
        params: GenerationParams,
        adapter: str | None,
        streamer: _RowZeroStreamer | None,
    ) -> list[str]:
        if n < 1:
            raise ValueError("n must be >= 1")
        enc = self._tokenizer(render_prompt(self._tokenizer, prompt), add_special_tokens=False)
        input_ids = torch.tensor([enc["input_ids"]], dtype=torch.long, device=self._device)
        sample = params.temperature > 0
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": params.max_new_tokens,
            "do_sample": sample,
            # Greedy decoding gives n identical rows: compute one, copy it.
            "num_return_sequences": n if sample else 1,
            "pad_token_id": self._tokenizer.pad_token_id,
            "eos_token_id": sorted(self._eos_ids),
        }
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        if streamer is not None:
            kwargs["streamer"] = streamer
        if (cancel := _cancel_event()) is not None:
            kwargs["stopping_criteria"] = [_Cancelled(cancel)]
        # A seeded call must not interleave with other sampling on the global torch RNG.
        with (
            self._use(adapter, exclusive=params.seed is not None),
            self._seeded(params.seed),
            torch.inference_mode(),
        ):
            if kwargs["num_return_sequences"] > 1 and input_ids.shape[1] > 1:
                kwargs["cache"] = self._call_torch(
                    self._shared_prefix, input_ids, n, params.max_new_tokens
                )
            out = self._call_torch(self._model.generate, **kwargs)
        texts = [self._decode_new(row[input_ids.shape[1] :]) for row in out]
        return texts if sample else texts * n

    def _shared_prefix(
        self, input_ids: torch.Tensor, n: int, max_new_tokens: int, *, static: bool = True
    ) -> Cache:
        """Prefill the prompt once and copy its KV cache to the ``n`` rows.

        ``generate`` with ``num_return_sequences=n`` would otherwise expand the prompt
        first and prefill it n times: on CPU with a long counseling prompt (system text,
        memories, history) that prefill dominates the time to the first token. All but
        the last prompt token go in the cache; ``generate`` feeds the last one itself.
        Sampling is unchanged (the same computation, batched differently).

        The rows go into a preallocated (static) cache of the prompt's length plus
        ``max_new_tokens``: a dynamic cache grows every layer by ``torch.cat`` at every
        step, copying all of it, which was 44% of a SmolLM2 turn's generation time in a
        profile (N = 5, 160 new tokens); the static one writes each step in place and
        gave the same text. Models whose layers are not plain full attention (see
        ``_prefix_sharing``) keep the dynamic cache, as does ``static=False`` (the
        reference bench/bench_turn.py measures against).
        """
        prefix = DynamicCache(config=self._model.config)
        # Only the cache is wanted: logits_to_keep=1 skips the vocabulary projection of
        # every other prompt token.
        self._model(input_ids=input_ids[:, :-1], cache=prefix, use_cache=True, logits_to_keep=1)
        if not (static and self._prefix_sharing):
            prefix.batch_repeat_interleave(n)
            return prefix
        length = input_ids.shape[1] - 1
        cache = StaticCache(
            config=self._model.config, max_cache_len=input_ids.shape[1] + max_new_tokens
        )
        for layer, stored in zip(cache.layers, prefix.layers, strict=True):
            assert isinstance(layer, StaticLayer) and isinstance(stored, DynamicLayer)
            keys, values = stored.keys, stored.values
            assert keys is not None and values is not None
            layer.lazy_initialization(keys.expand(n, -1, -1, -1), values.expand(n, -1, -1, -1))
            assert layer.keys is not None and layer.values is not None
            layer.keys[:, :, :length] = keys
            layer.values[:, :, :length] = values
            layer.cumulative_length.fill_(length)
        return cache

    def _choice_blocking(
        self,
        prompts: list[Prompt],
        choice_ids: list[int],
        adapter: str | None,
        *,
        share_prefixes: bool = True,
    ) -> list[list[float]]:
        """Next-token choice probabilities, one row per prompt, in input order.

        With ``share_prefixes`` (the default) every token prefix that prompts share is
        computed once, as vLLM's prefix caching would (:meth:`_shared_forward`; the
        judge's 240 pairwise prompts share the system prompt and conversation, then
        reply A, then reply B), and only each prompt's last position goes through the
        vocabulary projection. ``share_prefixes=False`` (or a model the shared path
        cannot serve) is the plain path, every prompt in full in one left-padded
        forward: the reference the shared path equals within
        float tolerance (the same attention over the same tokens at the same positions,
        only batched differently).
        """
        texts = [render_prompt(self._tokenizer, p) for p in prompts]
        rows = [list(self._tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        with self._use(adapter), torch.inference_mode():
            parts = decoder_and_head(self._model)
            if share_prefixes and self._prefix_sharing and parts is not None:
                out = self._call_torch(self._shared_choices, parts, rows, choice_ids)
            else:
                out = self._call_torch(self._plain_choices, rows, choice_ids)
        return [[float(x) for x in row] for row in out]

    def _plain_choices(self, rows: list[list[int]], choice_ids: list[int]) -> torch.Tensor:
        """Every row in full in one left-padded forward; only the last column is
        projected. Returns the choice probabilities, renormalised, ``[rows, k]``."""
        inputs, _ = self._segment_inputs(rows, None, None, 0)
        logits = self._model(**inputs, logits_to_keep=1).logits[:, -1, :]
        return _renormalised(logits, choice_ids)

    def _shared_choices(
        self, parts: tuple[Any, Any], rows: list[list[int]], choice_ids: list[int]
    ) -> torch.Tensor:
        """:meth:`_plain_choices` on shared prefixes: each leaf's last position (the last
        column, as segments are left-padded) through the vocabulary projection."""
        decoder, head = parts
        out = torch.empty((len(rows), len(choice_ids)), dtype=torch.float32)
        for items, hidden in self._shared_forward(decoder, rows, rows):
            out[items] = _renormalised(head(hidden[:, -1, :]), choice_ids)
        return out

    def _shared_forward(
        self, decoder: Any, prompts: list[list[int]], rows: list[list[int]]
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Run ``rows`` (each one prompt's tokens, and for sequence scoring its response
        after them) with every prefix the ``prompts`` share computed once; yield each
        batch of rows (indices) with its decoder states ``[batch, width, hidden]``. A row's
        own tokens are left-padded, so they fill the last columns.

        First the shared prefixes, level by level (:meth:`_prefill`); then every row's own
        tokens on the context it continues, batched by length across contexts
        (:func:`_length_batches`) rather than per prefix: the contrastive judge scores the
        same N replies under each persona, so one persona's replies padded to the longest
        were 40% padding in a measured SmolLM2 turn, while one reply under several
        personas has none. Each batch row keeps its own context (:meth:`_stack_contexts`).
        """
        leaves: list[tuple[int, _Context | None]] = []
        self._prefill(decoder, prefix_tree(prompts), None, leaves)
        # Whole prompts and continued contexts batch apart (a batch has a cache or none).
        for group in ([lf for lf in leaves if lf[1] is None], [lf for lf in leaves if lf[1]]):
            segments = [rows[item][0 if ctx is None else ctx[3] :] for item, ctx in group]
            for batch in _length_batches(segments):
                _check_cancelled()
                cache, past_mask, past_length = self._stack_contexts([group[k][1] for k in batch])
                inputs, _ = self._segment_inputs(
                    [segments[k] for k in batch], cache, past_mask, past_length
                )
                yield [group[k][0] for k in batch], decoder(**inputs).last_hidden_state

    def _prefill(
        self,
        decoder: Any,
        items: list[int | PrefixNode],
        context: _Context | None,
        leaves: list[tuple[int, _Context | None]],
    ) -> None:
        """Run the shared prefixes among ``items`` in one batch on ``context`` and recurse
        into their children; collect every leaf (a row) with the context it continues.
        A prefix is prompt tokens only, so no vocabulary projection is needed here."""
        leaves.extend((item, context) for item in items if isinstance(item, int))
        nodes = [item for item in items if isinstance(item, PrefixNode)]
        if not nodes:
            return
        _check_cancelled()
        length = 0 if context is None else context[3]
        if context is None:
            cache = DynamicCache(config=self._model.config)
        else:
            cache = self._cache_rows(context[0], context[1], len(nodes))
        inputs, mask = self._segment_inputs(
            [node.tokens[length:] for node in nodes],
            cache,
            None if context is None else context[2],
            length,
        )
        decoder(**inputs)
        for k, node in enumerate(nodes):
            self._prefill(decoder, node.children, (cache, k, mask[k], len(node.tokens)), leaves)

    def _segment_inputs(
        self,
        segments: list[list[int]],
        cache: DynamicCache | None,
        past_mask: torch.Tensor | None,
        past_length: int | torch.Tensor,
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """Forward arguments for ``segments`` left-padded after a context, and the
        attention mask of the rows' cache after them (``[rows, past + width]``).

        The context is one for all rows (``past_mask`` 1-D, ``past_length`` an int) or one
        per row (``[rows, past]`` and ``[rows, 1]``, :meth:`_stack_contexts`); none for
        whole prompts. The mask covers the context (its real positions and the holes its
        own padding left), then the padded segment; a segment's positions continue at the
        context's count of real tokens. Padding thus leaves masked holes that no real
        token attends to, and positions count real tokens only, so every row computes
        what its whole prompt would alone.
        """
        width = max(len(seg) for seg in segments)
        pad = int(self._tokenizer.pad_token_id)
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in segments], dtype=torch.long)
        segment_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in segments])
        positions = past_length + (segment_mask.cumsum(-1) - 1).clamp(min=0)
        attention = segment_mask
        if past_mask is not None:
            past = past_mask.to(segment_mask.dtype).expand(len(segments), -1)
            attention = torch.cat([past, segment_mask], dim=-1)
        inputs: dict[str, Any] = {
            "input_ids": input_ids.to(self._device),
            "attention_mask": attention.to(self._device),
            "position_ids": positions.to(self._device),
        }
        if cache is not None:
            inputs.update(cache=cache, use_cache=True)
        return inputs, attention

    def _cache_rows(self, cache: DynamicCache, row: int, n: int) -> DynamicCache:
        """A new cache holding row ``row`` of ``cache`` copied to ``n`` rows (plain KV
        layers only: see ``_prefix_sharing``)."""
        data: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in cache.layers:
            assert isinstance(layer, DynamicLayer)
            keys, values = layer.keys, layer.values
            assert keys is not None and values is not None
            data.append(
                (
                    keys[row : row + 1].expand(n, -1, -1, -1),
                    values[row : row + 1].expand(n, -1, -1, -1),
                )
            )
        return DynamicCache(ddp_cache_data=data, config=self._model.config)

    def _stack_contexts(
        self, contexts: list[_Context | None]
    ) -> tuple[DynamicCache | None, torch.Tensor | None, torch.Tensor | int]:
        """One cache whose row k holds context k (left-padded to the widest, the padding
        masked), its attention mask ``[rows, width]`` and each row's count of real tokens
        ``[rows, 1]``; ``(None, None, 0)`` when no row has a context (whole prompts)."""
        if all(context is None for context in contexts):
            return None, None, 0
        real = [context for context in contexts if context is not None]
        if len(real) < len(contexts):
            raise ValueError("a batch mixes whole prompts and continued contexts")
        width = max(int(mask.shape[0]) for _, _, mask, _ in real)
        data: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(len(real[0][0].layers)):
            keys: list[torch.Tensor] = []
            values: list[torch.Tensor] = []
            for cache, row, mask, _ in real:
                stored = cache.layers[layer]
                assert isinstance(stored, DynamicLayer)
                assert stored.keys is not None and stored.values is not None
                gap = (0, 0, width - int(mask.shape[0]), 0)  # left-pad the positions
                keys.append(torch.nn.functional.pad(stored.keys[row : row + 1], gap))
                values.append(torch.nn.functional.pad(stored.values[row : row + 1], gap))
            data.append((torch.cat(keys), torch.cat(values)))
        masks = torch.stack(
            [torch.nn.functional.pad(mask, (width - int(mask.shape[0]), 0)) for *_, mask, _ in real]
        )
        lengths = torch.tensor([[length] for *_, length in real])
        return DynamicCache(ddp_cache_data=data, config=self._model.config), masks, lengths

    def _logprobs_blocking(
        self,
        prompts: list[Prompt],
        responses: list[str],
        adapter: str | None,
        *,
        share_prefixes: bool = True,
    ) -> list[float]:
        """Sum of the response's token log-probabilities after its prompt, per pair.

        With ``share_prefixes`` (the default) the prompts' shared token prefixes are
        computed once (:meth:`_shared_forward`, the tree over the prompts alone), as in
        :meth:`_choice_blocking`: the contrastive judge scores every reply of a turn
        under the same 24 persona + conversation prompts, so each of those is read once
        per batch instead of once per reply. Each prompt's own tail and its response then
        run on the prefix's cache, and only the response positions go through the
        vocabulary projection. ``share_prefixes=False`` (or a model the shared path
        cannot serve) is :func:`response_logprobs`, the trainer's function: the
        reference the shared path equals within float tolerance.
        """
        texts = [render_prompt(self._tokenizer, p) for p in prompts]
        max_length = int(getattr(self._model.config, "max_position_embeddings", 4096) or 4096)
        with self._use(adapter), torch.inference_mode():
            parts = decoder_and_head(self._model)
            if share_prefixes and self._prefix_sharing and parts is not None:
                pairs = [
                    pair_ids(self._tokenizer, t, r, max_length=max_length, append_eos=True)
                    for t, r in zip(texts, responses, strict=True)
                ]
                if all(p for p, _ in pairs):
                    return self._call_torch(self._shared_logprobs, parts, pairs)
            values = self._call_torch(
                response_logprobs,
                self._model,
                self._tokenizer,
                texts,
                responses,
                max_length=max_length,
            )
        return [float(v) for v in values.cpu()]

    def _shared_logprobs(
        self, parts: tuple[Any, Any], pairs: list[tuple[list[int], list[int]]]
    ) -> list[float]:
        """The shared-prefix path of :meth:`_logprobs_blocking`: each response's token
        log-probabilities, read from the states one column before each of its tokens.

        A batch's response positions go through the vocabulary projection together (in
        slices of ``_HEAD_POSITIONS``): one large product instead of one per response,
        which on CPU runs faster per position; ``logit - logsumexp`` reads each logit row
        once where a full ``log_softmax`` would write a second vocabulary-wide row.
        """
        decoder, head = parts
        out = torch.zeros(len(pairs), dtype=torch.float32)
        rows = [prompt + response for prompt, response in pairs]
        for items, hidden in self._shared_forward(decoder, [p for p, _ in pairs], rows):
            width = hidden.shape[1]
            scored = [(k, item) for k, item in enumerate(items) if pairs[item][1]]
            if not scored:
                continue  # nothing to score: log p = 0, as response_logprobs gives
            # Left-padded segments: the response fills the last columns, each of its
            # tokens predicted one column earlier.
            states = torch.cat(
                [hidden[k, width - len(pairs[item][1]) - 1 : width - 1] for k, item in scored]
            )
            targets = torch.tensor(
                [token for _, item in scored for token in pairs[item][1]], device=states.device
            )
            logp = torch.cat(
                [
                    _token_logprobs(
                        head(states[k : k + _HEAD_POSITIONS]), targets[k : k + _HEAD_POSITIONS]
                    )
                    for k in range(0, len(targets), _HEAD_POSITIONS)
                ]
            )
            sums = torch.stack(
                [part.sum() for part in logp.split([len(pairs[i][1]) for _, i in scored])]
            )
            out[[item for _, item in scored]] = sums.cpu()
        return [float(v) for v in out]

    def _load_adapter_blocking(self, name: str, path: str, sha256: str = "") -> None:
        """Load (or replace) adapter ``name`` from ``path``.

        With ``sha256``, the folder is hashed again right before peft reads it, under the
        gate, and a mismatch is refused (:class:`AdapterRefused`) with nothing loaded: the
        caller verified the files and wrote them into a snapshot, and a change to that
        snapshot since then must not be served. What remains is the moment between this
        hash and peft's own read, which only the owner of a private (0700) snapshot
        folder can use (``webapp.learning.services.servable_path``). A repeated load of
        the same name and path reads nothing: the weights in memory are the ones that
        were checked when first loaded."""
        from peft import PeftModel

        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"adapter {name!r}: no adapter_config.json in {path}")
        with self._gate.hold(_ALL_ADAPTERS, exclusive=True):
            if self._adapters.get(name) == path:
                return  # idempotent (checked under the gate: two loads may race here)
            if sha256:
                verify_adapter(name, path, sha256)
            try:
                if name in self._adapters:  # same name, new weights: replace
                    self._delete_adapter_locked(name)
                if isinstance(self._model, PeftModel):
                    self._model.load_adapter(path, adapter_name=name)
                else:
                    self._model = PeftModel.from_pretrained(self._model, path, adapter_name=name)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                raise BackendError(f"cannot load adapter {name!r} from {path}: {exc}") from exc
            self._model.eval()
            self._adapters[name] = path
            self._state = _UNKNOWN

    def _unload_adapter_blocking(self, name: str) -> None:
        with self._gate.hold(_ALL_ADAPTERS, exclusive=True):
            if name in self._adapters:  # else: idempotent
                self._delete_adapter_locked(name)

    def _delete_adapter_locked(self, name: str) -> None:
        del self._adapters[name]
        self._state = _UNKNOWN
        if self._adapters:
            self._model.delete_adapter(name)
        else:
            # Last adapter gone: drop the peft wrapper so the model is the plain base again.
            self._model = self._model.unload().eval()

    # -- helpers --------------------------------------------------------------------------

    @staticmethod
    async def _in_thread(fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a worker thread that stops when this call is cancelled.

        Cancelling the awaiting task sets the call's event; the thread sees it at its next
        check (a generation step, a scoring batch, the gate) and the cancellation is
        re-raised once the thread has stopped, so the model is free when this returns.
        """
        cancel = threading.Event()

        def run() -> _T:
            with _cancelled_by(cancel):
                return fn(*args)

        worker = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            cancel.set()
            with contextlib.suppress(BaseException):
                await worker
            raise

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is not None and adapter not in self._adapters:
            raise BackendError(f"unknown adapter {adapter!r}; load it first")

    @contextlib.contextmanager
    def _use(self, adapter: str | None, *, exclusive: bool = False) -> Iterator[None]:
        """Hold the model for one call, set up for ``adapter``."""
        with self._gate.hold(adapter, exclusive=exclusive):
            _check_cancelled()  # cancelled while it waited for the model
            self._activate(adapter)
            yield

    def _activate(self, adapter: str | None) -> None:
        """Put the model in the state ``adapter`` asks for: that adapter active, or (for
        ``None``) every adapter disabled, so the output is exactly the base model's.

        Callers hold the gate, so every call running now wants the same state and the
        switch happens only when the key changes. We do not use peft's
        ``disable_adapter()`` context manager here: two overlapping calls would
        interleave its enter/exit and the first to leave re-enables adapters under the
        second one.
        """
        with self._state_lock:
            if adapter is not None and adapter not in self._adapters:
                # Unloaded while the call waited at the gate.
                raise BackendError(f"unknown adapter {adapter!r}; load it first")
            if not self._adapters or self._state == adapter:
                return
            if adapter is None:
                self._model.base_model.disable_adapter_layers()
            else:
                self._model.base_model.enable_adapter_layers()
                self._model.set_adapter(adapter, inference_mode=True)
            self._state = adapter

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Seed torch for one call without disturbing the process-wide RNG afterwards."""
        if seed is None:
            yield
            return
        devices: list[int] | None = [] if self._device.type == "cpu" else None
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    @staticmethod
    def _call_torch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError):
            raise  # a caller's mistake, not a backend failure
        except RuntimeError as exc:  # out of memory, device errors, ...
            raise BackendError(f"model call failed: {exc}") from exc

    def _choice_token_ids(self, choices: Sequence[str]) -> list[int]:
        if not choices:
            raise ValueError("choices must not be empty")
        ids: list[int] = []
        for choice in choices:
            enc = self._tokenizer.encode(choice, add_special_tokens=False)
            if len(enc) != 1:
                raise ValueError(f"choice {choice!r} is not a single token ({len(enc)} tokens)")
            ids.append(int(enc[0]))
        if len(set(ids)) != len(ids):
            raise ValueError(f"choices {list(choices)!r} map to the same token")
        return ids

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self._tokenizer.eos_token_id is not None:
            ids.add(int(self._tokenizer.eos_token_id))
        gen_eos = getattr(self._model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(int(x) for x in gen_eos)
        return ids

    def _decode_new(self, tokens: torch.Tensor) -> str:
        """Text of one generated row: cut at the first EOS, special tokens dropped."""
        ids = tokens.tolist()
        for i, token in enumerate(ids):
            if token in self._eos_ids:
                ids = ids[:i]
                break
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))
