"""Encryption at rest for free text people wrote: a model field, and key rotation.

What is encrypted: ``counseling.Turn.text`` (every transcript message),
``memory.MemoryItem.text`` (what the counselor remembers), and the JSON that carries copies
of them or of counselor replies: ``learning.CandidateGroup.prompt`` / ``candidates`` /
``search`` and ``learning.AdapterVersion.validation_report`` (its side-by-side prompts). The
rest is not, and why is in the README's Security section. Keys come from ``settings.PSYEVO_ENCRYPTION_KEYS``
(Fernet: AES-128-CBC with HMAC-SHA256, random IV, timestamped tokens); the first key
encrypts, every key decrypts, so a new key can be put first and the old one kept until
:func:`rotate_table` has moved every row to the new one.

Ciphertext is random, so the database cannot compare or search these columns: the field
refuses every SQL lookup except ``isnull`` with an error that says to filter in Python,
instead of silently matching nothing.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django import forms
from django.conf import settings
from django.core.exceptions import FieldError
from django.db import models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.lookups import Exact

# Every Fernet token starts with version byte 0x80 and a 64-bit timestamp whose high bytes
# are zero until 2106: base64 "gAAAAA". The database's CHECK constraints use this prefix to
# refuse plaintext written past the ORM.
TOKEN_PREFIX = "gAAAAA"
ROTATION_SETTING = "psyevo.rotating"


class DecryptionError(Exception):
    """Stored ciphertext that no configured key opens. Data is never lost by this: add the
    key that wrote it back to PSYEVO_ENCRYPTION_KEYS."""


def _fernets(keys: tuple[str, ...]) -> tuple[Fernet, MultiFernet]:
    if not keys:
        raise DecryptionError("PSYEVO_ENCRYPTION_KEYS is empty: no key to encrypt with")
    return Fernet(keys[0]), MultiFernet([Fernet(k) for k in keys])


@functools.lru_cache(maxsize=8)
def _cached(keys: tuple[str, ...]) -> tuple[Fernet, MultiFernet]:
    return _fernets(keys)


def current_keys() -> tuple[str, ...]:
    return tuple(settings.PSYEVO_ENCRYPTION_KEYS)


def encrypt(text: str) -> str:
    primary, _ = _cached(current_keys())
    return primary.encrypt(text.encode("utf-8")).decode("ascii")


def decrypt(token: str, *, where: str = "a value") -> str:
    _, multi = _cached(current_keys())
    try:
        return multi.decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeEncodeError):
        raise DecryptionError(
            f"cannot decrypt {where}: none of the {len(current_keys())} key(s) in "
            "PSYEVO_ENCRYPTION_KEYS opens it (was the key that wrote it removed before "
            "`manage.py rotate_keys` finished?)"
        ) from None


def warn_if_development_key() -> None:
    """Loud start-up line for the servers when the key is the DEBUG one from SECRET_KEY."""
    if getattr(settings, "PSYEVO_ENCRYPTION_KEY_IS_DERIVED", False):
        print(
            "WARNING: PSYEVO_ENCRYPTION_KEYS is unset: transcripts and memories are encrypted"
            " with a development key derived from SECRET_KEY (DEBUG only; never in production,"
            " where the key must come from the environment).",
            file=sys.stderr,
        )


def generate_key() -> str:
    return Fernet.generate_key().decode("ascii")


class EncryptedTextField(models.TextField):
    """A TextField stored as a Fernet token: encrypted on save, decrypted on load."""

    description = "Text encrypted at rest (Fernet)"

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None:
            return None
        return encrypt(self._serialise(value))

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None:
            return None
        return self._deserialise(decrypt(value, where=self._where()))

    def _serialise(self, value: Any) -> str:
        return str(value)

    def _deserialise(self, text: str) -> Any:
        return text

    def get_lookup(self, lookup_name: str) -> Any:
        if lookup_name == "isnull":
            return super().get_lookup(lookup_name)
        if lookup_name == "exact":
            return _exact_none_only(self)
        raise FieldError(self._no_sql(lookup_name))

    def get_transform(self, lookup_name: str) -> Any:
        raise FieldError(self._no_sql(lookup_name))

    def _where(self) -> str:
        model = getattr(self, "model", None)
        return f"{model._meta.label}.{self.name}" if model is not None else "an encrypted field"

    def _no_sql(self, lookup_name: str) -> str:
        return (
            f"{self._where()} is encrypted at rest: the database cannot evaluate "
            f"'{lookup_name}' on it; load the rows and filter in Python"
        )


def _exact_none_only(field: EncryptedTextField) -> type[Exact]:
    """``filter(f=None)`` is Django's spelling of ``f__isnull=True`` (it rewrites an exact
    lookup whose value is None); any other value cannot be compared in SQL."""

    class ExactNoneOnly(Exact):
        def __init__(self, lhs: Any, rhs: Any) -> None:
            if rhs is not None:
                raise FieldError(field._no_sql("exact"))
            super().__init__(lhs, rhs)

    return ExactNoneOnly


class EncryptedJSONField(EncryptedTextField):
    """A JSON value (what ``json.dumps`` accepts) serialised, then stored as a Fernet token
    in a text column. Python ``None`` is SQL NULL; the lookup rules are those of
    :class:`EncryptedTextField`, so no key, index or containment lookup reaches SQL.

    NaN and infinities are refused (``ValueError``), as PostgreSQL's jsonb refused them
    before: the stored value stays standard JSON that any reader can parse.
    """

    description = "JSON encrypted at rest (Fernet)"
    # For django-stubs: a JSON value in and out, like models.JSONField.
    _pyi_private_set_type: Any
    _pyi_private_get_type: Any
    _pyi_lookup_exact_type: Any

    def to_python(self, value: Any) -> Any:
        return value  # TextField's would turn a list into its repr before it is serialised

    def _serialise(self, value: Any) -> str:
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self._where()} takes a JSON value: {exc}") from None

    def _deserialise(self, text: str) -> Any:
        return json.loads(text)

    def value_to_string(self, obj: models.Model) -> Any:
        return self.value_from_object(obj)

    def formfield(
        self, form_class: Any = None, choices_form_class: Any = None, **kwargs: Any
    ) -> Any:
        # Field's, not TextField's (a plain textarea): the admin shows and parses JSON.
        return models.Field.formfield(
            self,
            form_class=form_class or forms.JSONField,
            choices_form_class=choices_form_class,
            **kwargs,
        )


def encrypted_fields() -> Iterator[tuple[type[models.Model], EncryptedTextField]]:
    """Every concrete model field that is encrypted (text or JSON), so rotation misses
    none."""
    from django.apps import apps

    for model in apps.get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        for field in model._meta.concrete_fields:
            if isinstance(field, EncryptedTextField):
                yield model, field


# --- Rewriting stored ciphertext (data migrations and key rotation) ---------------------------


@dataclass
class RotationReport:
    table: str
    column: str
    rewritten: int = 0
    current: int = 0  # already under the first key: nothing to do (rotation is idempotent)


def _fetch(
    connection: BaseDatabaseWrapper, cursor: Any, table: str, column: str, after: int, size: int
) -> list[tuple[int, str | None]]:
    quote = connection.ops.quote_name
    cursor.execute(
        f"SELECT id, {quote(column)} FROM {quote(table)} WHERE id > %s "
        "ORDER BY id LIMIT %s FOR UPDATE",
        [after, size],
    )
    return list(cursor.fetchall())


def _write(
    connection: BaseDatabaseWrapper,
    cursor: Any,
    table: str,
    column: str,
    rows: list[tuple[int, str]],
) -> None:
    """Rewrite ``column`` only. The turn table's trigger (counseling migration 0004) accepts
    such an UPDATE only while the transaction-local ``psyevo.rotating`` is on, and only when
    no other column changes; it is switched off again at once."""
    if not rows:
        return
    quote = connection.ops.quote_name
    cursor.execute("SELECT set_config(%s, 'on', true)", [ROTATION_SETTING])
    cursor.executemany(
        f"UPDATE {quote(table)} SET {quote(column)} = %s WHERE id = %s",
        [(value, pk) for pk, value in rows],
    )
    cursor.execute("SELECT set_config(%s, 'off', true)", [ROTATION_SETTING])


def rotate_table(
    connection: BaseDatabaseWrapper,
    table: str,
    column: str,
    *,
    keys: tuple[str, ...] | None = None,
    batch_size: int = 500,
    encrypt_plaintext: bool = False,
) -> RotationReport:
    """Re-encrypt every value of ``table.column`` under the first key.

    1. Rows are read in id order in batches, each batch locked and rewritten in its own
       transaction, so an interrupted run leaves every row readable and a re-run resumes.
    2. A value the first key already opens is left as it is (idempotent).
    3. A value no key opens stops the run with :class:`DecryptionError` before its batch is
       written, naming the row; with ``encrypt_plaintext`` (the data migration that
       introduced encryption) such a value is taken as legacy plaintext and encrypted.
    """
    primary, multi = _fernets(keys if keys is not None else current_keys())
    report = RotationReport(table=table, column=column)
    last = 0
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            rows = _fetch(connection, cursor, table, column, last, batch_size)
            if not rows:
                return report
            last = rows[-1][0]
            changed: list[tuple[int, str]] = []
            for pk, value in rows:
                if value is None:
                    continue
                new = _rotated(value, primary, multi, encrypt_plaintext)
                if new is None:
                    report.current += 1
                elif new is _UNREADABLE:
                    raise DecryptionError(
                        f"{table}.{column} id={pk}: no key in PSYEVO_ENCRYPTION_KEYS opens "
                        "it; nothing in its batch was changed. Put the key that wrote it back "
                        "(after the new one) and run rotate_keys again."
                    )
                else:
                    changed.append((pk, new))
            _write(connection, cursor, table, column, changed)
            report.rewritten += len(changed)


_UNREADABLE = "\x00unreadable"


def _rotated(
    value: str, primary: Fernet, multi: MultiFernet, encrypt_plaintext: bool
) -> str | None:
    """None when ``value`` is already under the first key, else its new token (or
    ``_UNREADABLE`` when no key opens it and it may not be taken as plaintext)."""
    token = value.encode("utf-8")
    try:
        primary.decrypt(token)
        return None
    except InvalidToken:
        pass
    try:
        return multi.rotate(token).decode("ascii")
    except InvalidToken:
        if not encrypt_plaintext:
            return _UNREADABLE
        return primary.encrypt(token).decode("ascii")


def decrypt_table(
    connection: BaseDatabaseWrapper, table: str, column: str, *, batch_size: int = 500
) -> int:
    """Back to plaintext (only to reverse the migration that introduced encryption)."""
    _, multi = _fernets(current_keys())
    count, last = 0, 0
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            rows = _fetch(connection, cursor, table, column, last, batch_size)
            if not rows:
                return count
            last = rows[-1][0]
            plain = [
                (pk, multi.decrypt(value.encode("ascii")).decode("utf-8"))
                for pk, value in rows
                if value is not None and value.startswith(TOKEN_PREFIX)
            ]
            _write(connection, cursor, table, column, plain)
            count += len(plain)
