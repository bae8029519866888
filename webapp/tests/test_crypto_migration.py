"""Upgrading a database that holds plaintext encrypts every row in place (and back)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from webapp.accounts.tests.factories import ClientProfileFactory
from webapp.lib import crypto

BEFORE = [("counseling", "0003_append_only_turns"), ("memory", "0001_initial")]


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] in ("counseling", "memory")]


def texts(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT text FROM {table} ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_the_data_migrations_encrypt_existing_rows_and_reverse_cleanly() -> None:
    profile = ClientProfileFactory()
    head = latest()
    migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO counseling_course (client_id, modality, planned_sessions, status,"
                " created_at) VALUES (%s, 'cbt', 8, 'active', now()) RETURNING id",
                [profile.user_id],
            )
            course_id = cursor.fetchone()[0]
            cursor.execute(
                "INSERT INTO counseling_session (course_id, client_id, index, mode, status,"
                " started_at, rated) VALUES (%s, %s, 0, 'graph', 'open', now(), false)"
                " RETURNING id",
                [course_id, profile.user_id],
            )
            session_id = cursor.fetchone()[0]
            for seq, words in enumerate(["I feel stuck", "Tell me more"]):
                cursor.execute(
                    "INSERT INTO counseling_turn (session_id, seq, role, text, skill, state_slot,"
                    " safety_level, client_msg_id, created_at)"
                    " VALUES (%s, %s, 'client', %s, '', '', 'none', '', now())",
                    [session_id, seq, words],
                )
            cursor.execute(
                "INSERT INTO memory_memoryitem (client_id, kind, text, origin, created_at)"
                " VALUES (%s, 'goal', 'sleep before midnight', 'client', now())",
                [profile.user_id],
            )
        migrate(head)
        turns, memories = texts("counseling_turn"), texts("memory_memoryitem")
        assert all(t.startswith(crypto.TOKEN_PREFIX) for t in turns + memories)
        assert [crypto.decrypt(t) for t in turns] == ["I feel stuck", "Tell me more"]
        assert [crypto.decrypt(t) for t in memories] == ["sleep before midnight"]

        migrate(BEFORE)
        assert texts("counseling_turn") == ["I feel stuck", "Tell me more"]
        assert texts("memory_memoryitem") == ["sleep before midnight"]
    finally:
        migrate(head)
