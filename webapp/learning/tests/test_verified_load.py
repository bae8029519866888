"""Adapters are loaded from the bytes that were verified (issue 18, item 5).

``servable_path`` checks the approved digest and writes a snapshot into a private folder
of this process; the in-process loader hashes that snapshot again right before reading
it. A snapshot changed in between (here: replaced by another, perfectly loadable
adapter's weights) is refused and never served.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from counselor_engine.backends.adapter_files import AdapterRefused
from counselor_engine.backends.tiny import build_tiny_adapter
from counselor_engine.backends.transformers_backend import TransformersBackend
from webapp.accounts.tests.factories import ClientProfileFactory, grant_all_consents
from webapp.counseling import runtime, services, turns
from webapp.counseling.models import Turn
from webapp.learning import services as gate
from webapp.learning.tests.helpers import make_version

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def adapters(tiny_model_dir: Path, tmp_path: Path) -> dict[str, Path]:
    """The approved adapter, and another one whose weights an attacker swaps in."""
    return {
        "approved": build_tiny_adapter(tiny_model_dir, tmp_path / "store" / "v1", seed=1),
        "other": build_tiny_adapter(tiny_model_dir, tmp_path / "other", seed=2),
    }


@pytest.mark.django_db
def test_it_snapshots_into_a_private_folder_outside_the_shared_store(adapters):  # type: ignore[no-untyped-def]
    version = make_version("v1", "active", adapters["approved"])
    served = gate.servable_path(version)

    root = gate.private_snapshot_root()
    assert served.parent == root
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()
    assert not served.resolve().is_relative_to(Path(settings.ADAPTER_DIR).resolve())
    assert str(os.getpid()) in root.name  # made per process
    assert gate.adapter_digest(served) == version.approved_sha256
    # vLLM reads from the store it shares with this node: that snapshot stays there.
    shared = gate.servable_path(version, shared=True)
    assert shared.parent == Path(settings.ADAPTER_DIR) / ".verified"


@pytest.mark.django_db
def test_the_loader_refuses_a_snapshot_changed_after_the_check(tiny_model_dir, adapters):  # type: ignore[no-untyped-def]
    version = make_version("v1", "active", adapters["approved"])
    path = gate.servable_path(version)
    (path / WEIGHTS).write_bytes((adapters["other"] / WEIGHTS).read_bytes())

    backend = TransformersBackend(tiny_model_dir)
    with pytest.raises(AdapterRefused, match="do not match the approved sha256"):
        asyncio.run(backend.load_adapter("v1", str(path), sha256=version.approved_sha256))
    assert backend.adapters == {}

    # The next check rewrites the snapshot from the verified bytes, which then load.
    path = gate.servable_path(version)
    asyncio.run(backend.load_adapter("v1", str(path), sha256=version.approved_sha256))
    assert backend.adapters == {"v1": str(path)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
async def test_a_turn_never_serves_a_snapshot_swapped_before_the_load(  # type: ignore[no-untyped-def]
    tiny_engine, adapters, monkeypatch
):
    """Through the turn path: the swap happens after ``servable_path`` returned and
    before ``load_adapter`` reads; the turn is refused, nothing is loaded or stored."""
    version = await sync_to_async(make_version)("v1", "active", adapters["approved"])
    profile = await sync_to_async(ClientProfileFactory)()
    await sync_to_async(grant_all_consents)(profile)
    session = await sync_to_async(services.start_session)(profile.user)
    assert session.adapter_version_id == version.pk

    checked = turns.servable_path

    def check_then_swap(v, **kwargs):  # type: ignore[no-untyped-def]
        path = checked(v, **kwargs)
        (path / WEIGHTS).write_bytes((adapters["other"] / WEIGHTS).read_bytes())
        return path

    monkeypatch.setattr(turns, "servable_path", check_then_swap)
    message = turns.ClientMessage(session.pk, profile.user, "I feel anxious about work.")
    events = [event async for event in turns.client_message(message)]

    failed = [e for e in events if isinstance(e, turns.Failed)]
    assert [e.code for e in failed] == ["adapter_refused"]
    assert not [e for e in events if isinstance(e, turns.Replied | turns.Token)]
    backend = await runtime.get_backend().get()
    assert "v1" not in backend.adapters
    roles = await sync_to_async(list)(
        Turn.objects.filter(session=session).values_list("role", flat=True)
    )
    assert roles == ["client"]  # the message is kept; no reply from swapped weights
