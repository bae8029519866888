"""The internal evaluator is a named setting, picked per model under "auto", and may run
on its own backend; it never reads an adapter."""

from __future__ import annotations

import asyncio
import time

import pytest

from counselor_engine.backends import BackendError
from counselor_engine.backends.base import ChatMessage
from counselor_engine.judge import DEFAULT_EVALUATOR_BY_MODEL, default_evaluator, model_key
from webapp.counseling import runtime


@pytest.fixture
def fresh_backends():  # type: ignore[no-untyped-def]
    runtime.reset_backend()
    yield
    runtime.reset_backend()


def test_auto_picks_the_measured_evaluator_for_the_default_model(settings, fresh_backends) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_BACKEND = "transformers"
    settings.PSYEVO_MODEL_PATH = ""
    settings.PSYEVO_JUDGE_EVALUATOR = "auto"
    judge = runtime.make_judge()
    assert judge.evaluator == DEFAULT_EVALUATOR_BY_MODEL["smollm2-135m-instruct"]
    assert judge.backend is runtime.get_backend()  # shares the counselor's by default


def test_auto_gives_other_models_the_ab_judge(settings, tiny_engine, fresh_backends) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_JUDGE_EVALUATOR = "auto"
    assert runtime.make_judge().evaluator == "ab"


def test_a_named_evaluator_overrides_auto(settings, tiny_engine, fresh_backends) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_JUDGE_EVALUATOR = "contrastive"
    assert runtime.make_judge().evaluator == "contrastive"


def test_debiased_without_a_measured_bias_fails_loudly(
    settings, tiny_engine, fresh_backends
) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_JUDGE_EVALUATOR = "ab_debiased"
    with pytest.raises(ValueError, match="no position bias measured"):
        runtime.make_judge()


async def test_the_judge_can_run_on_its_own_model(settings, tiny_engine, fresh_backends) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_JUDGE_BACKEND = "transformers"
    settings.PSYEVO_JUDGE_MODEL_PATH = str(tiny_engine)
    judge = runtime.make_judge()
    assert judge.backend is runtime.get_judge_backend()
    assert judge.backend is not runtime.get_backend()
    [p] = await judge.backend.choice_probabilities([[ChatMessage("user", "A or B?")]], ("A", "B"))
    assert sum(p) == pytest.approx(1.0)
    assert runtime.judge_model_name() == str(tiny_engine)


async def test_a_judge_server_without_its_url_is_a_backend_error(settings, fresh_backends) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_JUDGE_BACKEND = "vllm"
    settings.PSYEVO_JUDGE_VLLM_URL = ""
    settings.PSYEVO_JUDGE_VLLM_MODEL = "some-judge"
    with pytest.raises(BackendError, match="PSYEVO_JUDGE_VLLM_URL"):
        await runtime.get_judge_backend().get()  # type: ignore[attr-defined]
    assert runtime.judge_model_name() == "some-judge"


async def test_a_judge_server_gets_the_configured_timeout(
    settings, fresh_backends, silent_port: int
) -> None:  # type: ignore[no-untyped-def]
    """PSYEVO_BACKEND_TIMEOUT bounds the judge's server as it bounds the counselor's: a
    judge server that never answers is a BackendError after that long, not after the
    backend's own default."""
    settings.PSYEVO_BACKEND_TIMEOUT = 0.5
    settings.PSYEVO_JUDGE_BACKEND = "vllm"
    settings.PSYEVO_JUDGE_VLLM_URL = f"http://127.0.0.1:{silent_port}"
    settings.PSYEVO_JUDGE_VLLM_MODEL = "some-judge"
    backend = await runtime.get_judge_backend().get()  # type: ignore[attr-defined]
    assert backend.timeout == 0.5
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"timed out after 0\.5 s"):
        async with asyncio.timeout(10):
            await backend.choice_probabilities([[ChatMessage("user", "A or B?")]], ("A", "B"))
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("/data/models/SmolLM2-135M-Instruct/", "smollm2-135m-instruct"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
        ("qwen3-32b", "qwen3-32b"),
    ],
)
def test_model_names_are_matched_by_their_last_part(name: str, key: str) -> None:
    assert model_key(name) == key
    assert default_evaluator(name) == DEFAULT_EVALUATOR_BY_MODEL.get(key, "ab")
