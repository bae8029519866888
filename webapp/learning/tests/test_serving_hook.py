"""With the vLLM backend, activation hot-loads the adapter by name and unloads retired ones."""

from __future__ import annotations

import pytest

from counselor_engine.tests.fake_openai import FakeOpenAIServer
from webapp.accounts.tests.factories import ClientProfileFactory, ClinicianFactory
from webapp.counseling.models import Course, Session
from webapp.learning import services
from webapp.learning.models import AdapterVersion
from webapp.learning.tests.helpers import make_version, write_adapter_files

pytestmark = pytest.mark.django_db


@pytest.fixture
def vllm(settings):  # type: ignore[no-untyped-def]
    with FakeOpenAIServer() as server:
        settings.PSYEVO_BACKEND = "vllm"
        settings.PSYEVO_VLLM_URL = server.url
        yield server


@pytest.fixture
def versions(tmp_path):  # type: ignore[no-untyped-def]
    old = make_version("v1", "active", write_adapter_files(tmp_path / "v1", b"one"))
    new = make_version(
        "v2", "pending_approval", write_adapter_files(tmp_path / "v2", b"two"), parent=old
    )
    return old, new


def test_it_loads_the_activated_version_and_unloads_the_retired_one(
    vllm, versions, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    old, new = versions
    vllm.state.adapters["v1"] = old.path

    with django_capture_on_commit_callbacks(execute=True):
        services.approve(new, ClinicianFactory())

    shared = services.servable_path(new, shared=True)  # a vLLM server reads the store
    assert vllm.state.adapters == {"v2": str(shared.resolve())}
    new.refresh_from_db()
    assert new.load_error == ""


def test_it_keeps_a_retired_version_loaded_while_a_session_pins_it(
    vllm, versions, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    old, new = versions
    vllm.state.adapters["v1"] = old.path
    user = ClientProfileFactory().user
    course = Course.objects.create(client=user, modality="cbt")
    Session.objects.create(course=course, client=user, index=0, adapter_version=old)

    with django_capture_on_commit_callbacks(execute=True):
        services.approve(new, ClinicianFactory())

    assert set(vllm.state.adapters) == {"v1", "v2"}


def test_a_server_failure_is_recorded_and_leaves_one_active_version(
    vllm, versions, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    _old, new = versions
    vllm.state.fail_status = 503

    with django_capture_on_commit_callbacks(execute=True):
        services.approve(new, ClinicianFactory())

    new.refresh_from_db()
    assert new.status == "active" and "503" in new.load_error
    assert AdapterVersion.objects.filter(status="active").count() == 1
