"""The evidence buffer and validation reports keep copies of what clients wrote: those JSON
columns are encrypted at rest too, rotate with the rest, and refuse plaintext and SQL
lookups. Safety flags keep rule ids only, which the database enforces."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import FieldError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from webapp.counseling.models import Turn
from webapp.learning.models import AdapterVersion, CandidateGroup
from webapp.learning.tests.helpers import make_groups
from webapp.lib import crypto
from webapp.memory.models import MemoryItem
from webapp.oversight.models import SafetyFlag

KEY1, KEY2 = (Fernet.generate_key().decode() for _ in range(2))
CLIENT_WORDS = "my brother Sam stopped calling me"
SEARCH = {
    "strategy": "mctsr",
    "nodes": [{"id": 0, "text": "It sounds lonely since Sam went quiet.", "q": 0.4}],
}
REPORT = {
    "passed": True,
    "checks": [{"name": "update_norm", "passed": True, "value": 0.1}],
    "side_by_side": [
        {
            "group": "g1",
            "prompt": [{"role": "user", "content": CLIENT_WORDS}],
            "parent": "Tell me about Sam.",
            "candidate": "That silence from Sam hurts.",
        }
    ],
}
COLUMNS = [
    ("learning_candidategroup", "prompt"),
    ("learning_candidategroup", "candidates"),
    ("learning_candidategroup", "search"),
    ("learning_adapterversion", "validation_report"),
]


def raw(table: str, column: str, pk: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def cell(table: str, column: str, pk: int) -> str:
    value = raw(table, column, pk)
    assert value is not None, f"{table}.{column} id={pk} is NULL"
    return value


def group_with_client_words() -> CandidateGroup:
    prompt = [
        {"role": "system", "content": "You are a warm, careful counselor."},
        {"role": "user", "content": CLIENT_WORDS},
    ]
    return make_groups(1, prompt=prompt, search=SEARCH)[0]


# --- at rest ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_stores_evidence_and_reports_only_as_ciphertext_and_reads_them_back() -> None:
    group = group_with_client_words()
    version = AdapterVersion.objects.create(name="v-crypto", validation_report=REPORT)
    rows = {"learning_candidategroup": group.pk, "learning_adapterversion": version.pk}
    for table, column in COLUMNS:
        stored = raw(table, column, rows[table])
        assert stored is not None and stored.startswith(crypto.TOKEN_PREFIX), column
        assert "Sam" not in stored and "counselor" not in stored

    fresh = CandidateGroup.objects.get(pk=group.pk)
    assert fresh.prompt[1] == {"role": "user", "content": CLIENT_WORDS}
    assert fresh.candidates == group.candidates
    assert fresh.search == SEARCH
    assert AdapterVersion.objects.get(pk=version.pk).validation_report == REPORT
    assert list(CandidateGroup.objects.values_list("candidates", flat=True)) == [group.candidates]


@pytest.mark.django_db
def test_an_empty_search_or_report_stays_sql_null_and_is_found_by_none() -> None:
    group = make_groups(1)[0]  # no search tree: a graph-mode turn
    version = AdapterVersion.objects.create(name="v-empty")
    assert raw("learning_candidategroup", "search", group.pk) is None
    assert CandidateGroup.objects.get(pk=group.pk).search is None
    assert list(CandidateGroup.objects.filter(search=None)) == [group]
    assert list(CandidateGroup.objects.filter(search__isnull=False)) == []
    assert list(AdapterVersion.objects.exclude(validation_report=None)) == []
    version.validation_report = REPORT
    version.save()
    assert list(AdapterVersion.objects.exclude(validation_report=None)) == [version]


@pytest.mark.django_db
@pytest.mark.parametrize(("table", "column"), COLUMNS)
def test_the_database_refuses_plaintext_json_written_past_the_orm(table: str, column: str) -> None:
    pk = group_with_client_words().pk if table == "learning_candidategroup" else None
    if pk is None:
        pk = AdapterVersion.objects.create(name="v-plain", validation_report=REPORT).pk
    plain = json.dumps([{"role": "user", "content": CLIENT_WORDS}])
    with (
        pytest.raises(IntegrityError, match="encrypted"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [plain, pk])


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("lookup", "value"),
    [
        ("prompt", [{"role": "user", "content": "x"}]),
        ("prompt__contains", [{"role": "user"}]),
        ("candidates__0", "x"),
        ("candidates__icontains", "x"),
        ("search__nodes__0__text", "x"),
        ("search__has_key", "nodes"),
        ("validation_report__side_by_side__contains", [{"group": "g1"}]),
        ("candidates__in", [["x"]]),
    ],
)
def test_sql_lookups_on_encrypted_json_fail_loudly_instead_of_matching_nothing(
    lookup: str, value: Any
) -> None:
    model = AdapterVersion if lookup.startswith("validation_report") else CandidateGroup
    with pytest.raises(FieldError, match="filter in Python"):
        list(model.objects.filter(**{lookup: value}))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@hsettings(max_examples=60, deadline=None)
@given(JSON.filter(lambda v: v is not None))
def test_any_json_value_round_trips_through_the_field_and_always_looks_encrypted(
    value: Any,
) -> None:
    field = CandidateGroup._meta.get_field("candidates")
    token = field.get_db_prep_save(value, connection)
    assert token.startswith(crypto.TOKEN_PREFIX)
    assert field.from_db_value(token, None, connection) == value


def test_a_value_json_cannot_hold_is_refused_naming_the_field() -> None:
    field = CandidateGroup._meta.get_field("prompt")
    with pytest.raises(ValueError, match=r"learning\.CandidateGroup\.prompt takes a JSON value"):
        field.get_db_prep_save([math.nan], connection)
    with pytest.raises(ValueError, match="takes a JSON value"):
        field.get_db_prep_save({"when": object()}, connection)


@pytest.mark.django_db
def test_the_training_round_reads_evidence_as_it_was_written() -> None:
    from training_worker.round import to_train_group

    group = group_with_client_words()
    train = to_train_group(CandidateGroup.objects.get(pk=group.pk))
    assert train.prompt[1]["content"] == CLIENT_WORDS
    assert list(train.candidates) == group.candidates


# --- rotation ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_rotation_covers_evidence_and_reports_and_the_old_key_can_go(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_ENCRYPTION_KEYS = [KEY1]
    groups = make_groups(3, search=SEARCH)
    group = groups[0]
    version = AdapterVersion.objects.create(name="v-rotate", validation_report=REPORT)
    before = {col: raw("learning_candidategroup", col, group.pk) for col in ("prompt", "search")}

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2, KEY1]
    call_command("rotate_keys", "--batch-size", "2", stdout=(out := _Out()))
    for name in ("prompt", "candidates", "search"):
        assert f"learning.CandidateGroup.{name}: 3 re-encrypted, 0 already" in out.text
    assert "learning.AdapterVersion.validation_report: 1 re-encrypted" in out.text
    assert all(raw("learning_candidategroup", c, group.pk) != before[c] for c in before)

    settings.PSYEVO_ENCRYPTION_KEYS = [KEY2]
    rows = {g.pk: g for g in CandidateGroup.objects.all()}
    for g in groups:
        assert (rows[g.pk].prompt, rows[g.pk].candidates) == (g.prompt, g.candidates)
        assert rows[g.pk].search == SEARCH
    assert AdapterVersion.objects.get(pk=version.pk).validation_report == REPORT
    assert Turn.objects.filter(pk=group.turn_id).get().text == group.turn.text
    assert {f"{m._meta.label}.{f.name}" for m, f in crypto.encrypted_fields()} >= {
        "counseling.Turn.text",
        "memory.MemoryItem.text",
        "learning.CandidateGroup.prompt",
        "learning.CandidateGroup.candidates",
        "learning.CandidateGroup.search",
        "learning.AdapterVersion.validation_report",
    }
    assert MemoryItem._meta.get_field("text") in {f for _, f in crypto.encrypted_fields()}


# --- migrations -------------------------------------------------------------------------

BEFORE = [("learning", "0004_candidategroup_search")]
# Going forward to head also runs learning 0009, which withholds real client text from
# stored side-by-side entries (issue 18); its reverse cannot bring the text back.
SCRUBBED = {**REPORT, "side_by_side": [{"modality": "", "withheld": True}]}


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def learning_head() -> list[tuple[str, str]]:
    graph = MigrationExecutor(connection).loader.graph
    return [key for key in graph.leaf_nodes() if key[0] == "learning"]


@pytest.mark.django_db(transaction=True)
def test_the_data_migration_encrypts_existing_evidence_and_reverses_cleanly() -> None:
    group = group_with_client_words()
    head = learning_head()
    migrate(BEFORE)
    try:
        # Back on jsonb, in plaintext; add a row's worth of plaintext the old code wrote.
        assert json.loads(cell("learning_candidategroup", "prompt", group.pk))[1] == {
            "role": "user",
            "content": CLIENT_WORDS,
        }
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE learning_candidategroup SET candidates = %s::jsonb WHERE id = %s",
                [json.dumps(["older reply"]), group.pk],
            )
            cursor.execute(
                "INSERT INTO learning_adapterversion (name, status, path, sha256,"
                " validation_report, created_at, approved_sha256, decision_note, load_error)"
                " VALUES ('v-old', 'failed', '', '', %s::jsonb, now(), '', '', '')"
                " RETURNING id",
                [json.dumps(REPORT)],
            )
            version_id = cursor.fetchone()[0]

        migrate(head)
        for column in ("prompt", "candidates", "search"):
            assert cell("learning_candidategroup", column, group.pk).startswith(crypto.TOKEN_PREFIX)
        assert cell("learning_adapterversion", "validation_report", version_id).startswith(
            crypto.TOKEN_PREFIX
        )
        fresh = CandidateGroup.objects.get(pk=group.pk)
        assert (fresh.prompt, fresh.candidates, fresh.search) == (
            group.prompt,
            ["older reply"],
            SEARCH,
        )
        assert AdapterVersion.objects.get(pk=version_id).validation_report == SCRUBBED

        migrate(BEFORE)
        assert json.loads(cell("learning_candidategroup", "candidates", group.pk)) == [
            "older reply"
        ]
        assert json.loads(cell("learning_adapterversion", "validation_report", version_id)) == (
            SCRUBBED
        )
    finally:
        migrate(head)


# --- safety flags keep rule ids, not words -----------------------------------------------


@pytest.mark.django_db
def test_safety_flags_keep_rule_ids_and_the_database_refuses_copied_phrases() -> None:
    group = make_groups(1)[0]
    base = {"client": group.client, "session": group.session, "turn": group.turn}
    flag = SafetyFlag.objects.create(
        level="crisis", categories=["self_harm"], matched=["self_harm.plan", "model.crisis"], **base
    )
    assert SafetyFlag.objects.get(pk=flag.pk).matched == ["self_harm.plan", "model.crisis"]
    for matched in (["I want to end it all"], ["self_harm.plan", 3], {"rule": "x"}):
        with pytest.raises(IntegrityError, match="matched_rule_ids"), transaction.atomic():
            SafetyFlag.objects.create(level="crisis", matched=matched, **base)


class _Out:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass
