"""Transcript and memory text are encrypted at rest; keys rotate without losing a word."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import FieldError, ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from webapp.accounts.tests.factories import ClientProfileFactory
from webapp.counseling.models import Course, Session, Turn
from webapp.lib import crypto
from webapp.lib.env import env_fernet_keys
from webapp.memory.models import MemoryItem
from webapp.oversight.models import AuditEvent

KEY1, KEY2, KEY3 = (Fernet.generate_key().decode() for _ in range(3))


def stored(table: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT text FROM {table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.fixture
def session() -> Session:
    profile = ClientProfileFactory()
    course = Course.objects.create(client=profile.user, modality=profile.modality)
    return Session.objects.create(course=course, client=profile.user, index=0)


def add_turns(session: Session, texts: list[str]) -> list[Turn]:
    start = session.turns.count()
    return [
        Turn.objects.create(session=session, seq=start + i, role="client", text=t)
        for i, t in enumerate(texts)
    ]


def add_memory(session: Session, text: str) -> MemoryItem:
    return MemoryItem.objects.create(client=session.client, kind="fact", text=text, origin="client")


# --- at rest ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_stores_only_ciphertext_and_reads_back_the_words(session):  # type: ignore[no-untyped-def]
    turn = add_turns(session, ["I lost my job on Tuesday"])[0]
    memory = add_memory(session, "Sister is called Dana")
    for table, pk, words in [
        ("counseling_turn", turn.pk, "lost my job"),
        ("memory_memoryitem", memory.pk, "Dana"),
    ]:
        raw = stored(table, pk)
        assert raw.startswith(crypto.TOKEN_PREFIX)
        assert words not in raw
    assert Turn.objects.get(pk=turn.pk).text == "I lost my job on Tuesday"
    assert list(session.turns.values_list("text", flat=True)) == ["I lost my job on Tuesday"]
    assert MemoryItem.objects.get(pk=memory.pk).text == "Sister is called Dana"


@pytest.mark.django_db
def test_the_database_refuses_plaintext_written_past_the_orm(session):  # type: ignore[no-untyped-def]
    with (
        pytest.raises(IntegrityError, match="encrypted"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO memory_memoryitem (client_id, kind, text, origin, created_at)"
            " VALUES (%s, 'fact', 'plain words', 'client', now())",
            [session.client_id],
        )


@pytest.mark.django_db
def test_it_refuses_empty_memory_text(session):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="empty"):
        add_memory(session, "   ")


@pytest.mark.django_db
@pytest.mark.parametrize("lookup", ["text", "text__icontains", "text__startswith", "text__in"])
def test_sql_lookups_on_encrypted_text_fail_loudly_instead_of_matching_nothing(lookup):  # type: ignore[no-untyped-def]
    value = ["x"] if lookup.endswith("__in") else "x"
    with pytest.raises(FieldError, match="filter in Python"):
        list(Turn.objects.filter(**{lookup: value}))
    assert list(MemoryItem.objects.filter(text__isnull=True)) == []


@hsettings(max_examples=50, deadline=None)
@given(st.text(max_size=300))
def test_encryption_round_trips_any_text_and_always_looks_encrypted(text: str) -> None:
    token = crypto.encrypt(text)
    assert token.startswith(crypto.TOKEN_PREFIX)
    assert crypto.decrypt(token) == text


def test_a_malformed_key_stops_start_up_without_echoing_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PSYEVO_ENCRYPTION_KEYS", f"{KEY1},not-a-real-key-value")
    with pytest.raises(ImproperlyConfigured) as error:
        env_fernet_keys("PSYEVO_ENCRYPTION_KEYS")
    assert "key 2 of 2" in str(error.value)
    assert "not-a-real-key-value" not in str(error.value)
    monkeypatch.setenv("PSYEVO_ENCRYPTION_KEYS", f"{KEY1}, {KEY1}")
    with pytest.raises(ImproperlyConfigured, match="same key twice"):
        env_fernet_keys("PSYEVO_ENCRYPTION_KEYS")
    monkeypatch.setenv("PSYEVO_ENCRYPTION_KEYS", f" {KEY2} ,{KEY1}")
    assert env_fernet_keys("PSYEVO_ENCRYPTION_KEYS") == [KEY2, KEY1]


# --- the append-only trigger's one exception -----------------------------------------------


@pytest.mark.django_db
def test_the_rotation_setting_lets_only_the_text_column_change(session):  # type: ignore[no-untyped-def]
    turn = add_turns(session, ["hello"])[0]
    new_token = crypto.encrypt("hello")
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('psyevo.rotating', 'on', true)")
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            cursor.execute(
                "UPDATE counseling_turn SET role = 'counselor', text = %s WHERE id = %s",
                [new_token, turn.pk],
            )
        cursor.execute("UPDATE counseling_turn SET text = %s WHERE id = %s", [new_token, turn.pk])
        cursor.execute("SELECT set_config('psyevo.rotating', 'off', true)")
    assert stored("counseling_turn", turn.pk) == new_token
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Turn.objects.filter(pk=turn.pk).update(text="rewritten")


@pytest.mark.django_db(transaction=True)
def test_the_rotation_setting_ends_with_its_transaction(session):  # type: ignore[no-untyped-def]
    turn = add_turns(session, ["hello"])[0]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('psyevo.rotating', 'on', true)")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Turn.objects.filter(pk=turn.pk).update(text=crypto.encrypt("rewritten"))
    assert Turn.objects.get(pk=turn.pk).text == "hello"


# --- rotation ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_rotates_from_one_key_to_the_next_and_the_old_key_can_go(session, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    turns = add_turns(session, [f"message {i}" for i in range(7)])
    memory = add_memory(session, "likes long walks")

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2, KEY1]
    call_command("rotate_keys", "--batch-size", "3", stdout=(out := _Out()))
    assert "counseling.Turn.text: 7 re-encrypted, 0 already" in out.text
    assert "memory.MemoryItem.text: 1 re-encrypted" in out.text
    call_command("rotate_keys", stdout=(again := _Out()))
    assert "counseling.Turn.text: 0 re-encrypted, 7 already under the first key" in again.text

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2]
    assert [t.text for t in session.turns.order_by("seq")] == [t.text for t in turns]
    assert MemoryItem.objects.get(pk=memory.pk).text == "likes long walks"
    assert AuditEvent.objects.filter(action="keys.rotate").count() == 2
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Turn.objects.filter(pk=turns[0].pk).update(text="rewritten")


@pytest.mark.django_db
def test_a_wrong_key_is_a_clear_error_and_loses_nothing(session, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    turn = add_turns(session, ["keep me"])[0]
    before = stored("counseling_turn", turn.pk)

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY3]
    with pytest.raises(CommandError, match=rf"counseling_turn\.text id={turn.pk}: no key"):
        call_command("rotate_keys", stdout=_Out())
    with pytest.raises(crypto.DecryptionError, match=r"cannot decrypt counseling\.Turn\.text"):
        Turn.objects.get(pk=turn.pk)

    assert stored("counseling_turn", turn.pk) == before
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    assert Turn.objects.get(pk=turn.pk).text == "keep me"


@pytest.mark.django_db
def test_an_interrupted_rotation_leaves_everything_readable_and_resumes(session, settings):  # type: ignore[no-untyped-def]
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    add_turns(session, ["one", "two"])
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY3]  # a row written under a key rotation won't know
    add_turns(session, ["three"])
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    add_turns(session, ["four"])

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2, KEY1]
    with pytest.raises(CommandError, match="no key"):
        call_command("rotate_keys", "--batch-size", "1", stdout=_Out())

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2, KEY1, KEY3]
    assert [t.text for t in session.turns.order_by("seq")] == ["one", "two", "three", "four"]
    call_command("rotate_keys", "--batch-size", "1", stdout=(out := _Out()))
    assert "counseling.Turn.text: 2 re-encrypted, 2 already under the first key" in out.text
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2]
    assert [t.text for t in session.turns.order_by("seq")] == ["one", "two", "three", "four"]


def test_it_generates_a_usable_key() -> None:
    call_command("rotate_keys", "--generate", stdout=(out := _Out()))
    key = out.text.strip()
    assert Fernet(key).decrypt(Fernet(key).encrypt(b"ok")) == b"ok"


class _Out:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass
