"""The engine inside a web process: one model backend per process, loaded lazily.

Nothing here holds session state: a :class:`~counselor_engine.counselor.Counselor` is
rebuilt from PostgreSQL for every message, so any server process can serve any socket
(see docs on scaling). The model is the only per-process state, and it is loaded on
first use in a worker thread, so a crisis message never waits for (or needs) it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from django.conf import settings

from counselor_engine.backends import Backend, BackendError, make_backend
from counselor_engine.backends.base import GenerationParams, Prompt, StreamEvent
from counselor_engine.backends.process_backend import ProcessBackend
from counselor_engine.counselor import Counselor, CounselorConfig, default_generation
from counselor_engine.judge import Judge, default_evaluator, position_bias_for
from counselor_engine.models import MODEL_DIRNAME, resolve_model_path
from counselor_engine.seeds import stable_seed
from counselor_engine.skills import PriorTable
from webapp.counseling import services
from webapp.counseling.models import Session

log = logging.getLogger(__name__)


class LazyBackend:
    """A :class:`Backend` that builds the real one on first use (in a thread).

    A failure to build is not cached: the next call tries again, so an operator can fix
    the model path or start the vLLM server without restarting the web process.
    """

    name = "lazy"

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def _build(self) -> Backend:
        with self._lock:
            if self._backend is None:
                try:
                    self._backend = self._factory()
                except BackendError:
                    raise
                except Exception as exc:  # a model that cannot load is a backend failure
                    raise BackendError(f"cannot start the model backend: {exc}") from exc
            return self._backend

    async def get(self) -> Backend:
        if self._backend is not None:
            return self._backend
        return await asyncio.to_thread(self._build)

    async def generate(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> list[str]:
        return await (await self.get()).generate(prompt, n=n, params=params, adapter=adapter)

    async def generate_stream(
        self, prompt: Prompt, *, n: int, params: GenerationParams, adapter: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        backend = await self.get()
        async for event in backend.generate_stream(prompt, n=n, params=params, adapter=adapter):
            yield event

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], *, adapter: str | None = None
    ) -> list[list[float]]:
        return await (await self.get()).choice_probabilities(prompts, choices, adapter=adapter)

    async def sequence_logprobs(
        self, prompts: Sequence[Prompt], responses: Sequence[str], *, adapter: str | None = None
    ) -> list[float]:
        return await (await self.get()).sequence_logprobs(prompts, responses, adapter=adapter)

    async def load_adapter(self, name: str, path: str, *, sha256: str = "") -> None:
        await (await self.get()).load_adapter(name, path, sha256=sha256)

    async def unload_adapter(self, name: str) -> None:
        await (await self.get()).unload_adapter(name)

    def close(self) -> None:
        """Stop a model child process, if the real backend runs one."""
        backend, self._backend = self._backend, None
        if isinstance(backend, ProcessBackend):
            backend.close()


def _build_backend() -> Backend:
    if settings.PSYEVO_BACKEND == "vllm":
        if not settings.PSYEVO_VLLM_URL:
            raise BackendError("PSYEVO_BACKEND=vllm needs PSYEVO_VLLM_URL")
        return make_backend(
            "vllm",
            base_url=settings.PSYEVO_VLLM_URL,
            model=settings.PSYEVO_VLLM_MODEL,
            timeout=float(settings.PSYEVO_BACKEND_TIMEOUT),
        )
    path = settings.PSYEVO_MODEL_PATH or str(resolve_model_path(progress=log.info))
    threads = settings.PSYEVO_TORCH_THREADS or None
    if settings.PSYEVO_MODEL_PROCESS:
        backend = ProcessBackend(
            "transformers",
            {"model_path": path, "num_threads": threads},
            nice=settings.PSYEVO_MODEL_NICE,
        )
        # Start the child now (this runs in a worker thread): a model that cannot load is
        # a failure of this build, retried on the next call, like the in-process one.
        backend.start()
        return backend
    return make_backend("transformers", model_path=path, num_threads=threads)


def _counselor_model_name() -> str:
    if settings.PSYEVO_BACKEND == "vllm":
        return str(settings.PSYEVO_VLLM_MODEL)
    return str(settings.PSYEVO_MODEL_PATH or MODEL_DIRNAME)


def judge_model_name() -> str:
    """The model the internal evaluator runs on (its name picks the "auto" evaluator)."""
    kind = settings.PSYEVO_JUDGE_BACKEND
    if kind == "vllm":
        return str(settings.PSYEVO_JUDGE_VLLM_MODEL)
    if kind == "transformers":
        return str(settings.PSYEVO_JUDGE_MODEL_PATH)
    return _counselor_model_name()


def _build_judge_backend() -> Backend:
    kind = settings.PSYEVO_JUDGE_BACKEND
    if kind == "vllm":
        if not (settings.PSYEVO_JUDGE_VLLM_URL and settings.PSYEVO_JUDGE_VLLM_MODEL):
            raise BackendError(
                "PSYEVO_JUDGE_BACKEND=vllm needs PSYEVO_JUDGE_VLLM_URL and PSYEVO_JUDGE_VLLM_MODEL"
            )
        # The same bound as the counselor's server: without it a judge server that stops
        # answering held a turn for the backend's own 30 s default per request, whatever
        # the operator configured.
        return make_backend(
            "vllm",
            base_url=settings.PSYEVO_JUDGE_VLLM_URL,
            model=settings.PSYEVO_JUDGE_VLLM_MODEL,
            timeout=float(settings.PSYEVO_BACKEND_TIMEOUT),
        )
    if not settings.PSYEVO_JUDGE_MODEL_PATH:
        raise BackendError("PSYEVO_JUDGE_BACKEND=transformers needs PSYEVO_JUDGE_MODEL_PATH")
    threads = settings.PSYEVO_TORCH_THREADS or None
    if settings.PSYEVO_MODEL_PROCESS:
        backend = ProcessBackend(
            "transformers",
            {"model_path": settings.PSYEVO_JUDGE_MODEL_PATH, "num_threads": threads},
            nice=settings.PSYEVO_MODEL_NICE,
        )
        backend.start()
        return backend
    return make_backend(
        "transformers", model_path=settings.PSYEVO_JUDGE_MODEL_PATH, num_threads=threads
    )


_backend: LazyBackend | None = None
_judge_backend: LazyBackend | None = None
_backend_lock = threading.Lock()


def get_backend() -> LazyBackend:
    """The process-wide backend (built on first use)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            _backend = LazyBackend(_build_backend)
        return _backend


def get_judge_backend() -> Backend:
    """The internal evaluator's backend: the counselor's, or its own (a setting)."""
    global _judge_backend
    if settings.PSYEVO_JUDGE_BACKEND == "counselor":
        return get_backend()
    with _backend_lock:
        if _judge_backend is None:
            _judge_backend = LazyBackend(_build_judge_backend)
        return _judge_backend


def make_judge() -> Judge:
    """The internal evaluator the settings name. It always reads the base model
    (Judge never passes an adapter), so it never grades under the adapter being trained."""
    evaluator = settings.PSYEVO_JUDGE_EVALUATOR
    model = judge_model_name()
    if evaluator == "auto":
        evaluator = default_evaluator(model)
    bias = position_bias_for(model) if evaluator == "ab_debiased" else None
    return Judge(
        get_judge_backend(),
        votes=settings.PSYEVO_JUDGE_VOTES,
        evaluator=evaluator,
        position_bias=bias,
    )


def reset_backend() -> None:
    """Forget the process backends (tests switch models; operators after a config change)."""
    global _backend, _judge_backend
    with _backend_lock:
        for backend in (_backend, _judge_backend):
            if backend is not None:
                backend.close()
        _backend = _judge_backend = None


@cache
def prior_table() -> PriorTable:
    return PriorTable.load_default()


def counselor_config(*, mode: str, seed: int) -> CounselorConfig:
    """The product's engine settings, the one place that maps settings onto
    :class:`CounselorConfig` (the web turn, the simulation lab through
    :func:`counselor_for`, bench_ws); the seed makes a turn reproducible from storage.
    What settings do not name keeps the engine's default."""
    return CounselorConfig(
        n_candidates=settings.PSYEVO_CANDIDATES,
        mode=mode,  # type: ignore[arg-type]
        generation=replace(
            default_generation(),
            max_new_tokens=settings.PSYEVO_MAX_NEW_TOKENS,
            temperature=settings.PSYEVO_TEMPERATURE,
        ),
        turn_budget=settings.PSYEVO_TURN_BUDGET,
        max_message_chars=settings.PSYEVO_MAX_MESSAGE_CHARS,
        backend_timeout_s=settings.PSYEVO_BACKEND_TIMEOUT,
        safety_locale=settings.PSYEVO_SAFETY_LOCALE,
        beta=settings.LIPO.beta,
        judge_votes=settings.PSYEVO_JUDGE_VOTES,
        seed=seed,
        report_progress=True,  # a person waits at the chat page
    )


def counselor_for(
    session_id: int, seed_key: object, *, overrides: dict[str, Any] | None = None
) -> tuple[Counselor, Session]:
    """Rebuild the engine for a session from PostgreSQL (any process can serve it).

    ``seed_key`` makes the turn reproducible: the same session and key give the same
    skill draw and sampling seed. ``overrides`` replaces CounselorConfig fields (the
    simulation lab: its strategy, ablation switches and a run-derived seed)."""
    session = Session.objects.select_related("course", "client", "adapter_version").get(
        pk=session_id
    )
    config = counselor_config(mode=session.mode, seed=stable_seed(session.pk, seed_key))
    if overrides:
        config = replace(config, **overrides)
    counselor = Counselor(get_backend(), prior=prior_table(), judge=make_judge(), config=config)
    version = session.adapter_version
    counselor.start_session(services.client_state(session), version.name if version else None)
    counselor.restore_turns(services.stored_turns(session).records)
    return counselor, session
