"""Who may open which console page: assigned clinicians only, admins for the console,
clients never; a clinician probing another's client gets a 404, a log line and an audit
event."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.tests.factories import AdminFactory, ClinicianFactory
from webapp.memory.models import MemoryItem
from webapp.oversight.models import AuditEvent, ClientControl, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


def clinician_urls(profile, session, item):  # type: ignore[no-untyped-def]
    c = profile.user_id
    return [
        ("get", reverse("clinician_client", args=[c])),
        ("get", reverse("clinician_memory", args=[c])),
        ("post", reverse("clinician_memory_correct", args=[c, item.pk])),
        ("post", reverse("clinician_memory_retire", args=[c, item.pk])),
        ("get", reverse("clinician_skills", args=[c])),
        ("post", reverse("clinician_skills", args=[c])),
        ("get", reverse("session_review", args=[session.pk])),
    ]


def console_urls(profile):  # type: ignore[no-untyped-def]
    c = profile.user_id
    return [
        ("get", reverse("admin_home")),
        ("get", reverse("console_clients")),
        ("get", reverse("console_posteriors", args=[c])),
        (
            "get",
            reverse("console_posterior_cell", args=[c]) + "?slot=core/early/anxiety&skill=CBT1",
        ),
        ("get", reverse("console_population")),
        ("get", reverse("console_runs")),
        ("get", reverse("console_run", args=[1])),
        ("get", reverse("console_lineage")),
        ("get", reverse("console_audit")),
        ("get", reverse("console_audit_csv")),
        ("get", reverse("console_erase", args=[c])),
        ("post", reverse("console_erase", args=[c])),
        ("get", reverse("console_erasure", args=[1])),
    ]


def setup_client():  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile)
    item = MemoryItem.objects.create(client=profile.user, kind="fact", text="x", origin="counselor")
    return profile, session, item


def test_an_unassigned_clinician_gets_404_a_log_line_and_an_audit_event(client, caplog):  # type: ignore[no-untyped-def]
    profile, session, item = setup_client()
    intruder = ClinicianFactory()
    client.force_login(intruder)
    urls = clinician_urls(profile, session, item)
    with caplog.at_level(logging.WARNING, logger="psyevo.security"):
        for method, url in urls:
            assert getattr(client, method)(url).status_code == 404, url
    denied = AuditEvent.objects.filter(action="access.denied", actor=intruder)
    assert denied.count() == len(urls)
    assert set(denied.values_list("subject", flat=True)) == {profile.user_id}
    assert len([r for r in caplog.records if "not assigned" in r.getMessage()]) == len(urls)
    assert not MemoryItem.objects.filter(supersedes=item).exists()
    assert not ClientControl.objects.filter(client=profile.user).exists()
    assert not AuditEvent.objects.filter(actor=intruder).exclude(action="access.denied").exists()


def test_a_missing_client_or_session_is_the_same_404(client):  # type: ignore[no-untyped-def]
    client.force_login(ClinicianFactory())
    assert client.get(reverse("clinician_client", args=[987654])).status_code == 404
    assert client.get(reverse("session_review", args=[987654])).status_code == 404
    event = AuditEvent.objects.filter(action="access.denied").latest("id")
    assert event.subject is None and event.target == reverse("session_review", args=[987654])


def test_a_client_reaches_no_staff_url(client):  # type: ignore[no-untyped-def]
    profile, session, item = setup_client()
    client.force_login(profile.user)
    for method, url in clinician_urls(profile, session, item) + console_urls(profile):
        assert getattr(client, method)(url).status_code in (403, 404), url


def test_a_clinician_reaches_no_admin_console_url(client):  # type: ignore[no-untyped-def]
    profile, _, _ = setup_client()
    client.force_login(profile.clinician)
    for method, url in console_urls(profile):
        assert getattr(client, method)(url).status_code == 403, url


def test_an_admin_does_not_read_transcripts_through_the_clinician_console(client):  # type: ignore[no-untyped-def]
    profile, session, item = setup_client()
    client.force_login(AdminFactory())
    for method, url in clinician_urls(profile, session, item):
        assert getattr(client, method)(url).status_code == 403, url


def test_anonymous_visitors_are_sent_to_log_in(client):  # type: ignore[no-untyped-def]
    profile, session, item = setup_client()
    for method, url in clinician_urls(profile, session, item) + console_urls(profile):
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url
    assert client.get(reverse("my_data")).status_code == 302


def test_staff_cannot_download_a_clients_data(client):  # type: ignore[no-untyped-def]
    profile, _, _ = setup_client()
    for user in (profile.clinician, AdminFactory()):
        client.force_login(user)
        assert client.get(reverse("my_data_download")).status_code == 403


def test_a_clinician_a_flag_was_escalated_to_may_review_and_acknowledge_it(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile, open_=True)
    second = ClinicianFactory()
    flag = SafetyFlag.objects.create(
        client=profile.user, session=session, turn=session.turns.first(), level="crisis",
        escalated_to=second,
    )  # fmt: skip
    client.force_login(second)
    dashboard = client.get(reverse("clinician_home")).content.decode()
    assert "Escalated to you" in dashboard and profile.user.username in dashboard
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "escalated to you" in page
    # The covering clinician can step into the open flagged session (webapp.lib.access).
    assert f'href="{reverse("live_session", args=[session.pk])}"' in page
    # Only the flagged session: the client's other pages stay closed.
    assert client.get(reverse("clinician_client", args=[profile.user_id])).status_code == 404
    response = client.post(reverse("acknowledge_flag", args=[flag.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Acknowledged by" in response.content.decode()
    flag.refresh_from_db()
    assert flag.acknowledged_by == second


def test_a_covering_clinician_may_join_and_pause_only_while_the_flagged_session_is_open(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile, open_=True)
    second = ClinicianFactory()
    client.force_login(second)
    live = reverse("live_session", args=[session.pk])
    pause = reverse("pause_ai", args=[profile.user_id])
    assert client.get(live).status_code == 404  # no escalation: a stranger
    assert client.post(pause).status_code == 404
    assert not ClientControl.objects.filter(client=profile.user, ai_paused=True).exists()
    SafetyFlag.objects.create(
        client=profile.user, session=session, turn=session.turns.first(), level="crisis",
        escalated_to=second,
    )  # fmt: skip
    assert client.get(live).status_code == 200
    assert client.post(pause).status_code in (200, 302)
    control = ClientControl.objects.get(client=profile.user)
    assert control.ai_paused and control.paused_by == second
    assert AuditEvent.objects.filter(actor=second, action="ai.pause").exists()
    # Another client of the same assigned clinician stays closed to the covering one.
    other = client_profile(clinician=profile.clinician)
    assert client.post(reverse("pause_ai", args=[other.user_id])).status_code == 404
    # Once the flagged session has ended, pausing is the assigned clinician's alone again.
    session.status, session.ended_at = "ended", timezone.now()
    session.save(update_fields=["status", "ended_at"])
    assert client.post(reverse("resume_ai", args=[profile.user_id])).status_code == 404
