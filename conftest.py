"""Test-wide fixtures: real PostgreSQL and Redis always (see README), fast hashing."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
async def close_thread_db_connections():  # type: ignore[no-untyped-def]
    """Async tests open DB connections in asgiref's worker thread; close them after the
    test so the test database can be dropped (use in consumer tests)."""
    yield
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()
