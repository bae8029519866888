"""A backend that runs another backend in a child process.

Why: an in-process model on the CPU holds the interpreter lock for most of every forward
pass (a small model's work is mostly Python), so the server's event loop, and with it every
frame of every other session, waits behind it. Measured on 2 cores with 200 sockets, token
frames then reach the page seconds late. In a child process the model competes only for
cores, and the child lowers its own scheduling priority (``nice``) so that frames, crisis
replies and database work come first when the cores are busy. A model that crashes or runs
out of memory takes only the child with it: pending calls fail with :class:`BackendError`
(the engine answers with a retry), and the next call starts a fresh child and loads the
adapters the old one had.

The protocol is the :class:`Backend` protocol, call for call: the parent pickles the
arguments over a duplex pipe, the child awaits the same method of its own backend and sends
the result, an error, or (for streams) each delta. Batching is kept: a judge's 240 prompts
are one message and one batched ``choice_probabilities`` call in the child.

Choices (not in any paper): the child is started with the ``spawn`` method (forking a
process that has torch threads or an event loop is unsafe); it is started lazily on the
first call; it exits when the parent's end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .adapter_files import AdapterRefused
from .base import (
    Backend,
    BackendError,
    GenerationParams,
    Prompt,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

log = logging.getLogger(__name__)

_CALLS = ("generate", "choice_probabilities", "sequence_logprobs", "load_adapter", "unload_adapter")


@dataclass
class _Pending:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Any]]


class ProcessBackend(Backend):
    """Runs ``make_backend(kind, **kwargs)`` in a child process; see the module docstring.

    ``nice`` is added to the child's scheduling priority (0 leaves it alone);
    ``start_timeout`` bounds how long the child may take to load its model.
    """

    def __init__(
        self,
        kind: str,
        kwargs: dict[str, Any] | None = None,
        *,
        nice: int = 10,
        start_timeout: float = 300.0,
    ) -> None:
        if nice < 0:
            raise ValueError("nice must be >= 0 (a child may only lower its priority)")
        self.kind = kind
        self.name = f"process:{kind}"
        self._kwargs = dict(kwargs or {})
        self._nice = nice
        self._start_timeout = start_timeout
        self._lock = threading.Lock()  # guards the child's lifecycle and the pipe's send side
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        # name -> (path, sha256), replayed into a restarted child
        self._adapters: dict[str, tuple[str, str]] = {}
        _LIVE.add(self)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first call or after it exited)."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def _ensure_started(self) -> Connection:
        """Start the child if none is running (blocking: call it in a thread)."""
        with self._lock:
            if self._conn is not None and self._process is not None and self._process.is_alive():
                return self._conn
            self._shutdown_locked()
            ctx = multiprocessing.get_context("spawn")
            parent, child = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=_child_main,
                args=(child, self.kind, self._kwargs, self._nice, dict(self._adapters)),
                name=f"psyevo-model-{self.kind}",
                daemon=True,
            )
            process.start()
            child.close()
            try:
                if not parent.poll(self._start_timeout):
                    raise BackendError(
                        f"the model process did not start in {self._start_timeout:.0f} s"
                    )
                kind, *rest = parent.recv()
            except (EOFError, OSError) as exc:
                kind, rest = "error", [f"the model process exited while starting ({exc!r})"]
            except BackendError:
                process.kill()
                parent.close()
                raise
            if kind != "ready":
                process.join(timeout=10)
                parent.close()
                raise BackendError(f"cannot start the model backend: {rest[-1]}")
            self._conn, self._process = parent, process
            threading.Thread(
                target=self._read, args=(parent, process), name="psyevo-model-reader", daemon=True
            ).start()
            return parent

    def start(self) -> None:
        """Start the child now and wait until its model is loaded (blocking).

        Raises BackendError when it cannot load; calls start it on demand anyway."""
        self._ensure_started()

    def close(self) -> None:
        """Stop the child (pending calls fail with BackendError)."""
        with self._lock:
            self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        conn, process = self._conn, self._process
        self._conn = self._process = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()  # the child exits when its end of the pipe closes
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    def _read(self, conn: Connection, process: multiprocessing.process.BaseProcess) -> None:
        """Reader thread: route each message from the child to the caller's loop."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            call_id = message[1]
            pending = self._pending.get(call_id)
            if pending is not None:
                with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                    pending.loop.call_soon_threadsafe(
                        pending.queue.put_nowait, (message[0], message[2:])
                    )
        process.join(timeout=5)
        code = process.exitcode
        with self._lock:
            unexpected = self._conn is conn
            if unexpected:
                self._conn = self._process = None
        reason = f"the model process exited (exit code {code})"
        if unexpected:
            log.warning("%s", reason)
        for pending in list(self._pending.values()):
            with contextlib.suppress(RuntimeError):
                pending.loop.call_soon_threadsafe(pending.queue.put_nowait, ("lost", (reason,)))

    # -- calls ----------------------------------------------------------------------------
    async def _open(self, method: str, *args: Any) -> tuple[int, _Pending]:
        conn = await asyncio.to_thread(self._ensure_started)
        call_id = next(self._ids)
        pending = _Pending(asyncio.get_running_loop(), asyncio.Queue())
        self._pending[call_id] = pending
        try:
            with self._lock:
                conn.send(("call", call_id, method, args))
        except (OSError, ValueError) as exc:  # the child died between start and send
            self._pending.pop(call_id, None)
            raise BackendError(f"the model process is gone: {exc!r}") from exc
        return call_id, pending

    def _cancel(self, call_id: int) -> None:
        self._pending.pop(call_id, None)
        conn = self._conn
        if conn is not None:
            with self._lock, contextlib.suppress(OSError, ValueError):
                conn.send(("cancel", call_id))

    async def _call(self, method: str, *args: Any) -> Any:
        call_id, pending = await self._open(method, *args)
        try:
            kind, payload = await pending.queue.get()
        except BaseException:
            self._cancel(call_id)
            raise
        self._pending.pop(call_id, None)
        return _unwrap(kind, payload)

    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        return await self._call("generate", list(prompt), n, params, adapter)

    async def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        call_id, pending = await self._open("generate_stream", list(prompt), n, params, adapter)
        try:
            while True:
                kind, payload = await pending.queue.get()
                if kind == "delta":
                    yield StreamDelta(payload[0], payload[1])
                    continue
                texts = _unwrap(kind, payload)
                yield StreamDone(list(texts))
                return
        finally:
            # Done, failed or closed early: a stream still running in the child stops.
            self._cancel(call_id)

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        return await self._call(
            "choice_probabilities", [list(p) for p in prompts], list(choices), adapter
        )

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        return await self._call(
            "sequence_logprobs", [list(p) for p in prompts], list(responses), adapter
        )

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        await self._call("load_adapter", name, path, sha256)
        self._adapters[name] = (path, sha256)

    async def unload_adapter(self, name: str) -> None:
        await self._call("unload_adapter", name)
        self._adapters.pop(name, None)


def _unwrap(kind: str, payload: tuple[Any, ...]) -> Any:
    if kind == "result":
        return payload[0]
    if kind == "error":
        exc_type, message = payload
        if exc_type == "ValueError":
            raise ValueError(message)
        if exc_type == "AdapterRefused":
            raise AdapterRefused(message)
        raise BackendError(message)
    if kind == "lost":
        raise BackendError(payload[0])
    raise BackendError(f"unexpected message from the model process: {kind!r}")


_LIVE: weakref.WeakSet[ProcessBackend] = weakref.WeakSet()


@atexit.register
def _stop_children() -> None:
    for backend in list(_LIVE):
        backend.close()


# -- the child --------------------------------------------------------------------------------
def _child_main(
    conn: Connection,
    kind: str,
    kwargs: dict[str, Any],
    nice: int,
    adapters: dict[str, tuple[str, str]],
) -> None:
    """Entry point of the child: build the backend, then serve calls until the pipe closes."""
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    try:
        from . import make_backend

        backend = make_backend(kind, **kwargs)
        loop = asyncio.new_event_loop()
        for name, (path, sha256) in adapters.items():
            try:
                loop.run_until_complete(backend.load_adapter(name, path, sha256=sha256))
            except AdapterRefused as exc:
                # Changed since it was loaded: not replayed (a later load_adapter call,
                # from freshly verified bytes, loads it again); the model still starts.
                log.error("model process: adapter not reloaded: %s", exc)
    except BaseException as exc:  # reported to the parent, which raises BackendError
        with contextlib.suppress(OSError):
            conn.send(("error", 0, f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", 0))
    loop.run_until_complete(_ChildServer(conn, backend).serve())
    # Nothing is left to flush: skip interpreter teardown (idle torch and executor threads
    # can hold it for seconds, and the parent waits for this exit).
    os._exit(0)


class _ChildServer:
    def __init__(self, conn: Connection, backend: Backend) -> None:
        self.conn = conn
        self.backend = backend
        self.send_lock = threading.Lock()
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def send(self, *message: Any) -> None:
        with self.send_lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(message)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        closed = asyncio.Event()

        def read() -> None:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    loop.call_soon_threadsafe(closed.set)
                    return
                loop.call_soon_threadsafe(self.dispatch, message)

        threading.Thread(target=read, name="psyevo-model-requests", daemon=True).start()
        await closed.wait()
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def dispatch(self, message: tuple[Any, ...]) -> None:
        if message[0] == "cancel":
            task = self.tasks.get(message[1])
            if task is not None:
                task.cancel()
            return
        _, call_id, method, args = message
        task = asyncio.ensure_future(self.run(call_id, method, args))
        self.tasks[call_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(call_id, None))

    async def run(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method == "generate_stream":
                prompt, n, params, adapter = args
                stream = self.backend.generate_stream(prompt, n=n, params=params, adapter=adapter)
                async with contextlib.aclosing(stream) as events:  # type: ignore[type-var]
                    async for event in events:
                        if isinstance(event, StreamDelta):
                            self.send("delta", call_id, event.index, event.text)
                        else:
                            self.send("result", call_id, list(event.texts))
                return
            if method not in _CALLS:
                raise BackendError(f"unknown call {method!r}")
            if method == "generate":
                prompt, n, params, adapter = args
                result: Any = await self.backend.generate(
                    prompt, n=n, params=params, adapter=adapter
                )
            elif method in ("choice_probabilities", "sequence_logprobs"):
                prompts, other, adapter = args
                result = await getattr(self.backend, method)(prompts, other, adapter=adapter)
            elif method == "load_adapter":
                name, path, sha256 = args
                await self.backend.load_adapter(name, path, sha256=sha256)
                result = None
            else:
                result = await getattr(self.backend, method)(*args)
            self.send("result", call_id, result)
        except asyncio.CancelledError:
            return
        except ValueError as exc:
            self.send("error", call_id, "ValueError", str(exc))
        except AdapterRefused as exc:  # its own type: the caller refuses the version
            self.send("error", call_id, "AdapterRefused", str(exc))
        except Exception as exc:  # every other failure is a backend failure for the caller
            message = str(exc) if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
            self.send("error", call_id, "BackendError", message)
