"""Console tests use the real Redis cache, under a key prefix of their own per run."""

from __future__ import annotations

import uuid

import pytest

RUN_PREFIX = f"psyevo-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _own_cache_prefix(settings):  # type: ignore[no-untyped-def]
    settings.CACHES = {
        name: {**config, "KEY_PREFIX": RUN_PREFIX} for name, config in settings.CACHES.items()
    }
