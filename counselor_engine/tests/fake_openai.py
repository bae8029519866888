"""A small OpenAI-compatible test server: exactly the vLLM endpoints the client uses.

Deterministic and offline (stdlib ``http.server`` on 127.0.0.1 in a thread). It records
every request, so tests can check that ``n=5`` went out in one request and which
``model`` (adapter) was named. Its toy tokenizer is one token per character
(``id = ord(c) + 10``) with ChatML special tokens, and every token has a known
log-probability (:func:`token_logprob`), so tests can compute expected sums by hand.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BASE_MODEL = "tiny-base"
SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}


def tokenize(text: str) -> list[int]:
    """Toy tokenizer: special tokens by name, every other character its own token."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        for name, tid in SPECIAL.items():
            if text.startswith(name, i):
                ids.append(tid)
                i += len(name)
                break
        else:
            ids.append(ord(text[i]) + 10)
            i += 1
    return ids


def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def token_logprob(token_id: int, model: str) -> float:
    """Log-probability the fake model gives ``token_id`` anywhere; adapters shift it."""
    base = -((token_id % 7) + 1) / 10
    return base if model == BASE_MODEL else base - 0.05


def reply_text(model: str, messages: list[dict[str, str]], index: int) -> str:
    last = messages[-1]["content"] if messages else ""
    return f"[{model}] reply {index} to: {last}"


UNLISTED_LOGPROB = -9.0  # every token choice_logprobs does not list


def choice_logprobs(model: str, messages: list[dict[str, str]]) -> dict[str, float]:
    """Logprobs of the first reply token (the listed ones; every other token has
    ``UNLISTED_LOGPROB``): they depend on the prompt and the adapter."""
    last = messages[-1]["content"] if messages else ""
    shift = (len(last) % 5) * 0.3 + (0.0 if model == BASE_MODEL else 0.4)
    return {
        "A": -0.4 - shift, "B": -1.2, "1": -2.0, "2": -1.8, "3": -1.0 - shift,
        "4": -1.5, "5": -2.5, "The": -3.0,
    }  # fmt: skip


@dataclass
class FakeState:
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    adapters: dict[str, str] = field(default_factory=dict)
    # Test knobs.
    top_logprobs_override: dict[str, float] | None = None  # replaces choice_logprobs
    ignore_logprob_token_ids: bool = False  # behave like a server older than vLLM 0.32
    stall_stream_after: int | None = None  # chunks sent before the stream stops moving
    trickle_stream_s: float | None = None  # stream a chunk per this many seconds, for ever
    # (chunks sent, message): after that many chunks, vLLM's mid-stream error chunk, [DONE]
    stream_error_after: tuple[int, str] | None = None
    fail_status: int | None = None  # answer every request with this status
    fail_message: str = "injected failure"
    dribble_s: float | None = None  # send JSON replies one byte per this many seconds
    stop: threading.Event = field(default_factory=threading.Event)

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        state.requests.append((self.path, body))
        if state.fail_status is not None:
            self._json(state.fail_status, {"object": "error", "message": state.fail_message})
            return
        route = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/tokenize": self._tokenize,
            "/v1/load_lora_adapter": self._load,
            "/v1/unload_lora_adapter": self._unload,
        }.get(self.path)
        if route is None:
            self._json(404, {"object": "error", "message": f"no route {self.path}"})
            return
        route(body)

    # -- endpoints ----------------------------------------------------------------------------

    def _known_model(self, body: dict[str, Any]) -> str | None:
        model = str(body.get("model") or BASE_MODEL)
        if model != BASE_MODEL and model not in self.server.state.adapters:
            self._json(
                404,
                {
                    "object": "error",
                    "message": f"The model `{model}` does not exist.",
                    "type": "NotFoundError",
                    "code": 404,
                },
            )
            return None
        return model

    def _chat(self, body: dict[str, Any]) -> None:
        model = self._known_model(body)
        if model is None:
            return
        messages = body["messages"]
        n = int(body.get("n", 1))
        if body.get("logprobs"):
            self._chat_logprobs(model, body)
            return
        if n > 1 and float(body.get("temperature", 1.0)) == 0.0:  # as vLLM 0.32 answers
            self._json(400, {"object": "error", "message": "n must be 1 when using greedy "
                             f"sampling, got {n}.", "type": "BadRequestError", "code": 400})  # fmt: skip
            return
        texts = [reply_text(model, messages, i) for i in range(n)]
        if body.get("stream"):
            self._stream(model, texts)
            return
        choices = [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
            for i, t in enumerate(texts)
        ]
        self._json(200, {"object": "chat.completion", "model": model, "choices": choices})

    def _chat_logprobs(self, model: str, body: dict[str, Any]) -> None:
        """One generated token with logprobs: of the ids in ``logprob_token_ids``
        whatever their rank (vLLM 0.32), else of the ``top_logprobs`` best tokens."""
        state = self.server.state
        table = state.top_logprobs_override or choice_logprobs(model, body["messages"])
        ranked = sorted(table.items(), key=lambda kv: -kv[1])
        first = ranked[0] if ranked else ("The", -0.1)
        as_ids = bool(body.get("return_tokens_as_token_ids"))

        def name(token: str) -> str:
            return f"token_id:{tokenize(token)[0]}" if as_ids else token

        wanted = body.get("logprob_token_ids")
        if wanted and not state.ignore_logprob_token_ids:
            top = []
            for tid in wanted:
                token = chr(int(tid) - 10)
                top.append((token, table.get(token, UNLISTED_LOGPROB)))
        else:
            top = ranked[: int(body.get("top_logprobs") or 0)]
        content = [
            {
                "token": name(first[0]),
                "logprob": first[1],
                "top_logprobs": [{"token": name(t), "logprob": lp} for t, lp in top],
            }
        ]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": first[0]},
            "logprobs": {"content": content},
            "finish_reason": "length",
        }
        self._json(200, {"object": "chat.completion", "model": model, "choices": [choice]})

    def _stream(self, model: str, texts: list[str]) -> None:
        state = self.server.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        pieces = [t.split(" ") for t in texts]
        sent = 0
        for step in range(max(len(p) for p in pieces)):
            for index, words in enumerate(pieces):
                if step >= len(words):
                    continue
                if state.stall_stream_after is not None and sent >= state.stall_stream_after:
                    state.stop.wait(30)  # stop moving; the client's read timeout must fire
                    return
                if state.stream_error_after is not None and sent >= state.stream_error_after[0]:
                    self._stream_error(state.stream_error_after[1])
                    return
                text = words[step] if step == 0 else " " + words[step]
                chunk = {
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [{"index": index, "delta": {"content": text}}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                sent += 1
        while state.trickle_stream_s is not None:  # always moving, never done
            if state.stop.wait(state.trickle_stream_s):
                return
            chunk = {"object": "chat.completion.chunk", "model": model,
                     "choices": [{"index": 0, "delta": {"content": "."}}]}  # fmt: skip
            try:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            except OSError:  # the client gave up
                return
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _stream_error(self, message: str) -> None:
        """What vLLM 0.32 sends when a request fails after its 200: one error chunk in its
        ErrorResponse shape, then [DONE] (entrypoints/openai/chat_completion/serving.py)."""
        error = {"message": message, "type": "InternalServerError", "param": None, "code": 500}
        self.wfile.write(f"data: {json.dumps({'error': error})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _tokenize(self, body: dict[str, Any]) -> None:
        if self._known_model(body) is None:
            return
        if "messages" in body:
            text = render(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            text = str(body["prompt"])
        tokens = tokenize(text)
        self._json(200, {"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    def _completions(self, body: dict[str, Any]) -> None:
        model = self._known_model(body)
        if model is None:
            return
        ids = [int(t) for t in body["prompt"]]
        entries: list[dict[str, Any] | None] = [None]
        for tid in ids[1:]:
            lp = token_logprob(tid, model)
            entries.append({str(tid): {"logprob": lp, "rank": 1, "decoded_token": "?"}})
        choice = {"index": 0, "text": "x", "finish_reason": "length", "prompt_logprobs": entries}
        self._json(200, {"object": "text_completion", "model": model, "choices": [choice]})

    def _load(self, body: dict[str, Any]) -> None:
        name = body["lora_name"]
        if name in self.server.state.adapters:
            self._json(400, {"message": f"The lora adapter '{name}' has already been loaded."})
            return
        self.server.state.adapters[name] = body["lora_path"]
        self._text(200, f"Success: LoRA adapter '{name}' added successfully.")

    def _unload(self, body: dict[str, Any]) -> None:
        name = body["lora_name"]
        if self.server.state.adapters.pop(name, None) is None:
            self._json(400, {"message": f"The lora adapter '{name}' cannot be found."})
            return
        self._text(200, f"Success: LoRA adapter '{name}' removed successfully.")

    # -- replies ------------------------------------------------------------------------------

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        dribble = self.server.state.dribble_s
        if dribble is None:
            self.wfile.write(data)
            return
        for i in range(len(data)):  # always moving, never done: only a total bound ends it
            if self.server.state.stop.wait(dribble):
                return
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:  # the client gave up
                return

    def _text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: FakeState


class FakeOpenAIServer:
    """Start with ``with FakeOpenAIServer() as server:``; ``server.url`` is the root."""

    def __init__(self) -> None:
        self.state = FakeState()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.state = self.state
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
