"""The database itself enforces the product's invariants, whatever code path writes."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from webapp.accounts.tests.factories import ClientProfileFactory
from webapp.counseling.models import Course, Session, Turn
from webapp.oversight.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def course() -> Course:
    profile = ClientProfileFactory()
    return Course.objects.create(client=profile.user, modality=profile.modality)


def test_it_allows_one_open_session_per_client(course):  # type: ignore[no-untyped-def]
    Session.objects.create(course=course, client=course.client, index=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Session.objects.create(course=course, client=course.client, index=1)


def test_it_allows_a_new_session_once_the_last_one_ended(course):  # type: ignore[no-untyped-def]
    first = Session.objects.create(course=course, client=course.client, index=0)
    Session.objects.filter(pk=first.pk).update(status="ended", ended_at=timezone.now())
    Session.objects.create(course=course, client=course.client, index=1)


def test_it_refuses_duplicate_sequence_numbers(course):  # type: ignore[no-untyped-def]
    session = Session.objects.create(course=course, client=course.client, index=0)
    Turn.objects.create(session=session, seq=0, role="client", text="hello")
    with pytest.raises(IntegrityError), transaction.atomic():
        Turn.objects.create(session=session, seq=0, role="counselor", text="hi")


def test_it_refuses_to_update_a_turn_even_with_raw_sql(course):  # type: ignore[no-untyped-def]
    session = Session.objects.create(course=course, client=course.client, index=0)
    turn = Turn.objects.create(session=session, seq=0, role="client", text="hello")
    with pytest.raises(ValueError, match="append-only"):
        turn.save()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Turn.objects.filter(pk=turn.pk).update(text="rewritten")
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE counseling_turn SET text = 'x' WHERE id = %s", [turn.pk])
    turn.refresh_from_db()
    assert turn.text == "hello"


def test_it_refuses_a_second_duplicate_client_message_id(course):  # type: ignore[no-untyped-def]
    session = Session.objects.create(course=course, client=course.client, index=0)
    Turn.objects.create(session=session, seq=0, role="client", text="a", client_msg_id="m1")
    with pytest.raises(IntegrityError), transaction.atomic():
        Turn.objects.create(session=session, seq=1, role="client", text="a", client_msg_id="m1")


def test_it_refuses_to_rewrite_an_audit_event():  # type: ignore[no-untyped-def]
    event = AuditEvent.objects.create(action="login")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="nothing happened")
