"""Client of a vLLM OpenAI-compatible server (the production backend).

The server runs in its own environment (vLLM pins its own torch and transformers) with
LoRA enabled and runtime adapter loading allowed, on a private port: ``bin/vllm`` starts
and supervises one (vLLM's CPU build where there is no GPU); by hand::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \\
    python -m vllm.entrypoints.openai.api_server --model <model dir> \\
        --served-model-name smollm2-135m-instruct --host 127.0.0.1 --port 8001 \\
        --enable-lora --max-loras 4 --max-lora-rank 16 \\
        --lora-target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj

Mapping of the protocol onto the server:

- ``generate``: one ``/v1/chat/completions`` request with ``n=N``.
- ``generate_stream``: the same with ``stream=true`` (server-sent events); deltas of
  choice 0 are forwarded, all choices are accumulated for the final ``StreamDone``.
- ``choice_probabilities``: the choices are tokenized once (``/tokenize``; each must be
  one token), then one ``max_tokens=1`` chat request per prompt (sent concurrently: the
  server batches them) asks for the log-probability of exactly those token ids
  (``logprob_token_ids``, read from the full next-token distribution before any sampling
  step), whatever their rank; they are renormalised over the choices. Reading them off
  the ``top_logprobs`` list instead would count every choice outside the top 20 as 0.
- ``sequence_logprobs``: the prompt is rendered and tokenized by the server
  (``/tokenize`` with ``messages``, ``add_generation_prompt``), the response is tokenized
  alone and ``end_of_turn`` appended (as the transformers backend appends EOS), then
  ``/v1/completions`` scores the concatenated ids with ``prompt_logprobs=0`` and we sum
  the response positions. The server must not put a LoRA on the output head
  (``--lora-target-modules`` without ``lm_head``, as ``bin/vllm`` starts it): with one
  there, vLLM 0.32 applies per-request LoRA indices to per-token prompt logits and its
  engine dies as soon as a scoring request shares a step with any other request.
- adapters: ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``; a request chooses
  its adapter with ``model=<adapter name>``.

Every failure (refused connection, timeout, non-2xx, malformed reply, an error chunk in
a stream) surfaces as :class:`BackendError`. A request is bounded by ``timeout`` seconds
in all, a stream too (from the request to ``[DONE]``), so a server that stops answering
or trickles never hangs a session; a server whose engine died answers 500 at once and is
reported as such (``bin/vllm`` then restarts it).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx2 as httpx

from .base import (
    Backend,
    BackendError,
    GenerationParams,
    Prompt,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

__all__ = ["VLLMBackend"]

# vLLM's reply to every request once its engine core has died (EngineDeadError).
ENGINE_DEAD_MARKERS = ("EngineCore encountered an issue", "EngineDeadError", "Engine loop")


class VLLMBackend(Backend):
    """See the module docstring. ``base_url`` is the server root (a trailing ``/v1`` is
    accepted and dropped); ``model`` is the served base model name."""

    name = "vllm"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        end_of_turn: str | None = "<|im_end|>",
    ) -> None:
        root = base_url.rstrip("/")
        self.base_url = root.removesuffix("/v1")
        self.model = model
        self.timeout = timeout
        self.end_of_turn = end_of_turn
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._choice_ids: dict[str, int] = {}  # one tokenizer for the base and its adapters

    # -- protocol ---------------------------------------------------------------------------

    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        asked = _distinct_samples(n, params)
        body = self._chat_body(prompt, n=asked, params=params, adapter=adapter)
        data = await self._post("/v1/chat/completions", body)
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
            texts = [str(c["message"]["content"] or "") for c in choices]
        except (KeyError, TypeError) as exc:
            raise BackendError(f"vLLM chat reply malformed: {exc!r}") from exc
        if len(texts) != asked:
            raise BackendError(f"vLLM returned {len(texts)} choices, expected {asked}")
        return texts * (n // asked)

    async def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """See :meth:`Backend.generate_stream`. Closing the generator early closes the
        HTTP stream, which makes vLLM abort the request.

        The whole stream, from the request to ``[DONE]``, is bounded by ``timeout``: a
        per-read bound alone lets a server that trickles a chunk now and then hold the
        session for ever. The deadline is checked around each read, never across a
        ``yield``: a timeout scope spanning a yield would cancel the consumer's code."""
        path = "/v1/chat/completions"
        asked = _distinct_samples(n, params)
        body = self._chat_body(prompt, n=asked, params=params, adapter=adapter)
        body["stream"] = True
        texts = [""] * asked
        deadline = asyncio.get_running_loop().time() + self.timeout
        async with self._client() as client:
            try:
                async with asyncio.timeout_at(deadline):
                    resp = await client.send(
                        client.build_request("POST", path, json=body), stream=True
                    )
            except TimeoutError as exc:
                raise self._timeout_error(path) from exc
            except httpx.HTTPError as exc:
                raise self._transport_error(path, exc) from exc
            payloads = _sse_data(resp)
            try:
                if resp.status_code >= 300:
                    async with asyncio.timeout_at(deadline):
                        await resp.aread()
                    raise self._status_error(path, resp)
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            payload = await anext(payloads)
                    except StopAsyncIteration:
                        break
                    if payload == "[DONE]":
                        yield StreamDone(texts * (n // asked))
                        return
                    for index, text in _stream_deltas(payload):
                        if not 0 <= index < asked:
                            raise BackendError(f"vLLM streamed choice {index} of {asked}")
                        texts[index] += text
                        if index == 0 and text:
                            yield StreamDelta(0, text)
            except TimeoutError as exc:
                raise self._timeout_error(path) from exc
            except httpx.HTTPError as exc:
                raise self._transport_error(path, exc) from exc
            finally:
                await payloads.aclose()
                await resp.aclose()
        raise BackendError("vLLM stream ended without [DONE]")

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        if not choices:
            raise ValueError("choices must not be empty")
        if len(set(choices)) != len(choices):
            raise ValueError(f"duplicate choices {list(choices)!r}")
        ids = await self._choice_token_ids(choices, adapter)
        return list(await asyncio.gather(*(self._choice_one(p, ids, adapter) for p in prompts)))

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        if len(prompts) != len(responses):
            raise ValueError("prompts and responses differ in length")
        return list(
            await asyncio.gather(
                *(self._logprob_one(p, r, adapter) for p, r in zip(prompts, responses, strict=True))
            )
        )

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        """Ask the server to load ``path`` as ``name``; ``sha256`` is not checked here.

        The server, not this process, reads the files, maybe on another node, so nothing
        here can hash what it reads. What holds instead (``servable_path(shared=True)``
        in the web app): right before this call the web side read the version's files
        once, compared their digest with the approved one and wrote exactly those bytes
        into ``ADAPTER_DIR/.verified/<name>-<sha>/``, the path sent here. The server
        reads them during this call and keeps the weights in memory; a repeated load of
        the same name is answered "already loaded" without reading the files again, so
        a change made after the first successful load is never served by that server.
        The window that remains is from that write to the server's read, during this
        call, and only for whoever can write the shared adapter store: keep the store
        writable by the service user alone and mounted read-only on vLLM nodes
        (docs/deploy.md). A restarted server reads the snapshot again on its next load,
        which the web side rewrites from verified bytes first."""
        body = {"lora_name": name, "lora_path": str(path)}
        # vLLM answers 400 "... has already been loaded" to a repeated load: that is the
        # idempotent success the protocol promises.
        await self._post("/v1/load_lora_adapter", body, ok_if=("already",), expect_json=False)

    async def unload_adapter(self, name: str) -> None:
        # Unloading an unknown adapter is answered 400/404 "... cannot be found": fine.
        await self._post(
            "/v1/unload_lora_adapter",
            {"lora_name": name},
            ok_if=("cannot be found", "not found", "does not exist"),
            expect_json=False,
        )

    # -- one request each -------------------------------------------------------------------

    async def _choice_token_ids(self, choices: Sequence[str], adapter: str | None) -> list[int]:
        """The one token id of each choice (as the transformers backend insists too)."""
        missing = [c for c in choices if c not in self._choice_ids]
        replies = await asyncio.gather(
            *(
                self._post(
                    "/tokenize",
                    {"model": adapter or self.model, "prompt": c, "add_special_tokens": False},
                )
                for c in missing
            )
        )
        for choice, reply in zip(missing, replies, strict=True):
            try:
                tokens = [int(t) for t in reply["tokens"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise BackendError(f"vLLM /tokenize reply malformed: {exc!r}") from exc
            if len(tokens) != 1:
                raise ValueError(f"choice {choice!r} is not a single token ({len(tokens)} tokens)")
            self._choice_ids[choice] = tokens[0]
        ids = [self._choice_ids[c] for c in choices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"choices {list(choices)!r} map to the same token")
        return ids

    async def _choice_one(self, prompt: Prompt, ids: list[int], adapter: str | None) -> list[float]:
        body = {
            "model": adapter or self.model,
            "messages": _messages(prompt),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "logprob_token_ids": ids,
            "return_tokens_as_token_ids": True,  # "token_id:N": no decoding ambiguity
        }
        data = await self._post("/v1/chat/completions", body)
        try:
            entries = data["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            found = {_token_id(str(e["token"])): float(e["logprob"]) for e in entries}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"vLLM reply has no logprobs for the choices: {exc!r}") from exc
        if any(i not in found for i in ids):
            # An older server ignores logprob_token_ids and answers its top-k: refuse to
            # guess the missing probabilities.
            raise BackendError(
                f"vLLM did not score the choice tokens {ids} (it needs logprob_token_ids, "
                "vLLM >= 0.32)"
            )
        return _renormalised([found[i] for i in ids])

    async def _logprob_one(self, prompt: Prompt, response: str, adapter: str | None) -> float:
        model = adapter or self.model
        prompt_tok = await self._post(
            "/tokenize",
            {
                "model": model,
                "messages": _messages(prompt),
                "add_generation_prompt": True,
                "add_special_tokens": False,
            },
        )
        text = response + (self.end_of_turn or "")
        response_tok = await self._post(
            "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        try:
            p_ids = [int(t) for t in prompt_tok["tokens"]]
            r_ids = [int(t) for t in response_tok["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"vLLM /tokenize reply malformed: {exc!r}") from exc
        ids = p_ids + r_ids
        data = await self._post(
            "/v1/completions",
            {
                "model": model,
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
                "add_special_tokens": False,
            },
        )
        try:
            entries = data["choices"][0]["prompt_logprobs"]
            if len(entries) != len(ids):
                raise ValueError(f"{len(entries)} prompt_logprobs for {len(ids)} tokens")
            total = 0.0
            for pos in range(len(p_ids), len(ids)):
                entry = entries[pos]
                if pos == 0 or entry is None:  # the first token has no context to score it
                    continue
                total += float(entry[str(ids[pos])]["logprob"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"vLLM prompt_logprobs malformed: {exc!r}") from exc
        return total

    # -- HTTP ---------------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        # One client per call: a client is tied to the event loop that first used it, and
        # callers (web workers, Celery tasks, tests) run their own loops.
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=httpx.Timeout(self.timeout),
            trust_env=False,  # the vLLM port is private: never route it through a proxy
        )

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        ok_if: tuple[str, ...] = (),
        expect_json: bool = True,
    ) -> Any:
        try:
            # The whole exchange, not each network operation, is bounded by the timeout.
            async with asyncio.timeout(self.timeout), self._client() as client:
                resp = await client.post(path, json=body)
        except TimeoutError as exc:
            raise self._timeout_error(path) from exc
        except httpx.HTTPError as exc:
            raise self._transport_error(path, exc) from exc
        if resp.status_code >= 300:
            if ok_if and resp.status_code in (400, 404):
                detail = resp.text.lower()
                if any(marker in detail for marker in ok_if):
                    return None
            raise self._status_error(path, resp)
        if not expect_json:
            return None
        try:
            return resp.json()
        except ValueError as exc:
            raise BackendError(f"vLLM {path}: reply is not JSON") from exc

    def _timeout_error(self, path: str) -> BackendError:
        return BackendError(f"vLLM at {self.base_url}{path} timed out after {self.timeout} s")

    def _transport_error(self, path: str, exc: Exception) -> BackendError:
        if isinstance(exc, httpx.TimeoutException):
            return self._timeout_error(path)
        return BackendError(f"vLLM at {self.base_url}{path} unreachable: {exc!r}")

    @staticmethod
    def _status_error(path: str, resp: httpx.Response) -> BackendError:
        text = resp.text
        if resp.status_code >= 500 and any(m in text for m in ENGINE_DEAD_MARKERS):
            return BackendError(
                f"vLLM {path} answered {resp.status_code}: its engine is dead "
                f"(bin/vllm restarts it): {text[:300]}"
            )
        return BackendError(f"vLLM {path} answered {resp.status_code}: {text[:500]}")

    def _chat_body(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None
    ) -> dict[str, Any]:
        if n < 1:
            raise ValueError("n must be >= 1")
        body: dict[str, Any] = {
            "model": adapter or self.model,
            "messages": _messages(prompt),
            "n": n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        return body


def _distinct_samples(n: int, params: GenerationParams) -> int:
    """How many choices to ask vLLM for: greedy decoding (temperature 0) gives n equal
    replies, and vLLM refuses ``n > 1`` with it ("n must be 1 when using greedy
    sampling"), so ask for one and repeat it, as the transformers backend would return."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return 1 if params.temperature <= 0.0 else n


def _token_id(token: str) -> int:
    """``"token_id:42"`` (vLLM's form with ``return_tokens_as_token_ids``) -> 42."""
    prefix, _, number = token.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise ValueError(f"not a token id: {token!r}")
    return int(number)


def _renormalised(logprobs: list[float]) -> list[float]:
    """Probabilities proportional to ``exp(logprobs)``, summing to 1 (shifted by the
    maximum first, so choices far down the distribution neither underflow to 0/0 nor
    lose precision)."""
    top = max(logprobs)
    if not math.isfinite(top):
        raise BackendError(f"vLLM gave the choices no probability: {logprobs}")
    weights = [math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def _messages(prompt: Prompt) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in prompt]


async def _sse_data(resp: httpx.Response) -> AsyncGenerator[str, None]:
    """The ``data:`` payloads of a server-sent event stream (multi-line data joined)."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if line == "":
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    if lines:
        yield "\n".join(lines)


def _stream_deltas(payload: str) -> list[tuple[int, str]]:
    try:
        chunk = json.loads(payload)
        if "error" in chunk:
            raise _stream_error(chunk["error"])
        out = []
        for choice in chunk.get("choices", []):
            text = (choice.get("delta") or {}).get("content") or ""
            out.append((int(choice["index"]), str(text)))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BackendError(f"vLLM stream chunk malformed: {payload[:200]!r}") from exc


def _stream_error(error: Any) -> BackendError:
    """vLLM cannot change a stream's status once it has sent 200: a request that fails
    mid-stream (its engine died, or this request broke) ends with one
    ``data: {"error": {"message", "type", "code"}}`` chunk, then ``[DONE]``."""
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind = f"{error.get('type') or 'error'} {error.get('code') or ''}".strip()
    else:
        message, kind = str(error), "error"
    if any(m in message for m in ENGINE_DEAD_MARKERS):
        return BackendError(
            f"vLLM stream failed ({kind}): its engine is dead (bin/vllm restarts it): "
            f"{message[:300]}"
        )
    return BackendError(f"vLLM stream failed ({kind}): {message[:500]}")
