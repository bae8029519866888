"""Shared engine fixtures: a tiny random-weight chat model (built once per session), LoRA
adapters for it, a backend on it, and a fake OpenAI-compatible server.

Other test suites (judge, counselor, webapp, training worker) reuse ``tiny_model_path``
and ``tiny_backend`` so every model-backed test is exact, offline and fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from counselor_engine.backends.base import ChatMessage
from counselor_engine.tests.fake_openai import FakeOpenAIServer

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests (real SmolLM2) run only when asked for with ``-m slow`` (or ``-m vllm``:
    the vllm tests are slow ones too, and a run that selects them skips nothing)."""
    markexpr = config.getoption("markexpr", "") or ""
    if "slow" in markexpr or "vllm" in markexpr:
        return
    skip = pytest.mark.skip(reason="slow: uses the real SmolLM2 model; run with -m slow")
    for item in items:
        if "slow" in item.keywords and _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fast_password_hasher() -> None:
    """Overrides the root conftest's autouse fixture of that name, which needs
    pytest-django's ``settings``: engine tests import no Django and must also run with
    ``-p no:django``."""


@pytest.fixture(autouse=True)
def _private_crisis_spool() -> None:
    """Overrides the root conftest's fixture of that name (it needs Django's settings)."""


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + locally trained tokenizer, saved like a real model folder."""
    from counselor_engine.backends.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tiny_adapter_paths(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Two distinct non-trivial LoRA adapters for the tiny model, by name."""
    from counselor_engine.backends.tiny import build_tiny_adapter

    root = tmp_path_factory.mktemp("tiny-adapters")
    return {
        name: build_tiny_adapter(tiny_model_path, root / name, seed=seed)
        for name, seed in (("v1", 1), ("v2", 2))
    }


@pytest.fixture
def tiny_backend(tiny_model_path: Path):  # -> TransformersBackend
    """A fresh backend per test: adapters loaded by one test never leak into another."""
    from counselor_engine.backends.transformers_backend import TransformersBackend

    return TransformersBackend(tiny_model_path)


@pytest.fixture
def chat_prompt() -> list[ChatMessage]:
    return [
        ChatMessage("system", "You are a warm, careful counselor."),
        ChatMessage("user", "I feel anxious about work."),
    ]


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server
