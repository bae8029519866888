"""An adapter's whole life on a real vLLM server (bin/vllm, vLLM's CPU build): a real LiPO
round on SmolLM2 on the CPU, a clinician's approval, the active version hot-loaded by
name, replies that differ at temperature 0, and a rollback that unloads it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from counselor_engine import models
from counselor_engine.backends import ChatMessage, GenerationParams
from counselor_engine.backends.tiny import build_tiny_adapter
from counselor_engine.backends.vllm_backend import VLLMBackend
from counselor_engine.tests import vllm_server
from training_worker.round import run_round
from webapp.accounts.tests.factories import ClinicianFactory
from webapp.learning import services
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.tests.helpers import make_evidence, make_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.django_db,
    pytest.mark.timeout(1800),
]

GREEDY = GenerationParams(max_new_tokens=40, temperature=0.0, top_p=1.0)
# Like the evidence's client messages (helpers.FEELINGS), which the round learns from.
PROMPT = [
    ChatMessage("system", "You are a warm, careful counselor."),
    ChatMessage("user", "I feel anxious about work and I cannot sleep."),
]


def served(url: str) -> set[str]:
    reply = httpx.get(f"{url}/v1/models", timeout=30, trust_env=False)
    reply.raise_for_status()
    return {m["id"] for m in reply.json()["data"]}


@pytest.fixture
def on_vllm(lipo_settings: Any, vllm_url: str) -> Any:
    """The round trains SmolLM2 in process (transformers, CPU); serving is vLLM's."""
    lipo_settings.PSYEVO_MODEL_PATH = str(models.ensure_default_model())
    lipo_settings.PSYEVO_BACKEND = "vllm"
    lipo_settings.PSYEVO_VLLM_URL = vllm_url
    lipo_settings.PSYEVO_VLLM_MODEL = vllm_server.SERVED_NAME
    # Few steps, a large rate: enough for the trained update to show in a greedy reply.
    # 3e-2 overshot on this machine's fresh install (transformers 5.24, peft 0.21): the
    # candidate greedily wrote "------" and held-out accuracy fell from 0.62 to 0.15, so
    # validation rightly failed it. At 1e-2 it rises to 1.00 and the reply still changes.
    lipo_settings.LIPO = replace(
        lipo_settings.LIPO,
        lora_rank=8,
        learning_rate=1e-2,
        steps=4,
        max_update_ratio=10.0,
        side_by_side=1,
    )
    return lipo_settings


def test_a_round_is_approved_hot_loaded_by_name_and_rolled_back(
    on_vllm: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    url = on_vllm.PSYEVO_VLLM_URL
    model_dir = Path(on_vllm.PSYEVO_MODEL_PATH)
    # The version to roll back to: an approved LoRA whose B is almost zero (the base, in
    # effect), active and loaded when the round starts.
    start = make_version(
        "v-start",
        "active",
        build_tiny_adapter(model_dir, tmp_path / "v-start", seed=1, rank=8, scale=1e-6),
    )
    services.sync_serving(start.pk, [])
    make_evidence()
    run = TrainingRun.objects.create()

    outcome = run_round(run.pk)  # a real LiPO round on SmolLM2
    assert outcome == "pending_approval", TrainingRun.objects.get(pk=run.pk).error

    version = AdapterVersion.objects.get(pk=TrainingRun.objects.get(pk=run.pk).output_version_id)
    assert version.parent_id == start.pk and version.name not in served(url)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(version, ClinicianFactory())

    version.refresh_from_db()
    assert version.status == "active" and version.load_error == ""
    assert version.name in served(url) and start.name not in served(url)  # hot-loaded by name
    backend = VLLMBackend(url, model=vllm_server.SERVED_NAME, timeout=600.0)
    [base] = asyncio.run(backend.generate(PROMPT, n=1, params=GREEDY))
    [tuned] = asyncio.run(backend.generate(PROMPT, n=1, params=GREEDY, adapter=version.name))
    assert tuned != base, tuned

    with django_capture_on_commit_callbacks(execute=True):
        services.rollback(AdapterVersion.objects.get(pk=start.pk), ClinicianFactory(), "test")

    version.refresh_from_db()
    assert version.status == "retired"
    assert version.name not in served(url) and start.name in served(url)  # unloaded
    [again] = asyncio.run(backend.generate(PROMPT, n=1, params=GREEDY, adapter=start.name))
    # Served again: the start version, the base model in all but bf16 rounding (measured:
    # the first 123 characters of a greedy reply equal the base's), not the tuned one.
    assert again != tuned and again[:40] == base[:40]
    asyncio.run(backend.unload_adapter(start.name))
