"""The clinician console: a client's page, the session review, memory and outcome trends."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.memory.models import MemoryItem
from webapp.oversight import console
from webapp.oversight.models import AuditEvent, SafetyFlag
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


def test_it_shows_why_each_reply_was_chosen(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = make_session(profile, skill="CBT2", credit=0.8)
    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "I feel anxious about work" in page
    assert "CBT2" in page and "(chosen)" in page and "Identifying automatic thoughts" in page
    assert "16.7%" in page  # the probability of each skill at decision time
    assert "The 3 candidates" in page and "C1 (delivered)" in page
    assert 'class="soca-graph"' in page and 'class="node delivered"' in page
    assert page.count('class="edge"') == 3
    assert "outcome 0.70" in page and "credit 0.800" in page
    assert AuditEvent.objects.filter(
        action="transcript.read", actor=profile.clinician, subject=profile.user
    ).exists()


def test_model_text_is_escaped_everywhere(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile)
    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "<script>alert(1)</script>" not in page and "<b>Tell me</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_skill_excluded_at_the_time_shows_probability_zero(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = make_session(profile, skill="CBT1")
    decision = session.turns.get(seq=1).decision
    records = dict(decision.records)
    del records["CBT4"]
    type(decision).objects.filter(pk=decision.pk).update(records=records)
    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "excluded at the time" in page


def test_the_client_page_lists_courses_sessions_and_the_trend(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    first = make_session(
        profile,
        reward=0.7,
        rating={"relationship": 8, "goals_and_topics": 7, "approach": 9, "overall": 8},
    )
    make_session(profile, reward=0.75)
    client.force_login(profile.clinician)
    page = client.get(reverse("clinician_client", args=[profile.user_id])).content.decode()
    assert reverse("session_review", args=[first.pk]) in page
    assert "Review session 2" in page
    assert 'src="data:image/svg+xml;base64,' in page
    assert "Falling trend" not in page
    assert AuditEvent.objects.filter(action="client.read", subject=profile.user).exists()


def test_a_falling_trend_is_flagged_on_the_client_page_and_dashboard(client):  # type: ignore[no-untyped-def]
    falling = client_profile()
    for reward in (0.9, 0.7, 0.6, 0.4):
        make_session(falling, reward=reward)
    steady = client_profile(clinician=falling.clinician)
    for reward in (0.7, 0.5, 0.6):
        make_session(steady, reward=reward)
    client.force_login(falling.clinician)
    page = client.get(reverse("clinician_client", args=[falling.user_id])).content.decode()
    assert "Falling trend" in page and "0.70 → 0.60 → 0.40" in page
    dashboard = client.get(reverse("clinician_home")).content.decode()
    assert 'id="falling"' in dashboard and '<span class="badge danger">falling</span>' in dashboard
    assert dashboard.count('<span class="badge danger">falling</span>') == 1
    assert reverse("clinician_client", args=[steady.user_id]) in dashboard


@pytest.mark.parametrize(
    ("rewards", "falling"),
    [
        ([0.9, 0.8, 0.7], True),
        ([0.5, 0.9, 0.8, 0.7], True),
        ([0.9, 0.8, 0.8], False),  # strictly: equal is not falling
        ([0.9, 0.7, 0.8], False),
        ([0.9, 0.8], False),  # fewer than three sessions
        ([], False),
    ],
)
def test_falling_means_strictly_decreasing_over_the_last_three(rewards, falling):  # type: ignore[no-untyped-def]
    assert console.is_falling(rewards) is falling


def test_sessions_without_a_reward_do_not_break_the_trend(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    for reward in (0.8, None, 0.6, 0.5):
        make_session(profile, reward=reward)
    assert console.outcome_trend(profile.user).falling
    assert list(console.falling_clients([profile.user_id])) == [profile.user_id]


def test_memory_review_corrects_and_retires_keeping_the_source(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile)
    item = MemoryItem.objects.create(
        client=profile.user, kind="fact", text="Works night shifts", origin="counselor",
        source_session=session, source_turn=1,
    )  # fmt: skip
    other = MemoryItem.objects.create(
        client=profile.user, kind="goal", text="Sleep <b>better</b>", origin="counselor"
    )
    client.force_login(profile.clinician)
    page = client.get(reverse("clinician_memory", args=[profile.user_id])).content.decode()
    assert "Works night shifts" in page and "Sleep &lt;b&gt;better&lt;/b&gt;" in page
    assert AuditEvent.objects.filter(action="memory.read", subject=profile.user).exists()

    url = reverse("clinician_memory_correct", args=[profile.user_id, item.pk])
    client.post(url, {"text": "Works day shifts since May"})
    new = MemoryItem.objects.get(supersedes=item)
    assert (new.text, new.origin, new.created_by, new.source_session, new.source_turn) == (
        "Works day shifts since May", "clinician", profile.clinician, session, 1,
    )  # fmt: skip
    client.post(reverse("clinician_memory_retire", args=[profile.user_id, other.pk]))
    other.refresh_from_db()
    assert other.retired_by == profile.clinician

    page = client.get(reverse("clinician_memory", args=[profile.user_id])).content.decode()
    assert "Works day shifts since May" in page
    assert "History (1 earlier version)" in page and "Works night shifts" in page
    assert "retired" in page
    actions = set(AuditEvent.objects.filter(subject=profile.user).values_list("action", flat=True))
    assert {"memory.correct", "memory.retire"} <= actions

    response = client.post(url, {"text": "again"}, follow=True)
    assert "already corrected" in response.content.decode()


def test_an_empty_correction_is_refused(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    item = MemoryItem.objects.create(client=profile.user, kind="fact", text="x", origin="counselor")
    client.force_login(profile.clinician)
    url = reverse("clinician_memory_correct", args=[profile.user_id, item.pk])
    response = client.post(url, {"text": ""}, follow=True)
    assert "This field is required" in response.content.decode()
    assert not MemoryItem.objects.filter(supersedes=item).exists()


def test_the_flag_links_to_the_session_review(client):  # type: ignore[no-untyped-def]
    profile = client_profile()
    session = make_session(profile, open_=True)
    SafetyFlag.objects.create(
        client=profile.user, session=session, turn=session.turns.first(), level="crisis"
    )
    client.force_login(profile.clinician)
    dashboard = client.get(reverse("clinician_home")).content.decode()
    assert reverse("session_review", args=[session.pk]) in dashboard
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "CRISIS" in page and "Acknowledge" in page
    assert reverse("live_session", args=[session.pk]) in page


def test_an_mctsr_turn_shows_how_its_candidates_were_searched(client):  # type: ignore[no-untyped-def]
    from webapp.learning.models import CandidateGroup

    profile = client_profile("cbt")
    session = make_session(profile)
    search = {"node_count": 7, "calls_used": 11, "max_calls": 12, "stop_reason": "budget",
              "q_values": [6.25, 5.5, 4.0]}  # fmt: skip
    CandidateGroup.objects.filter(session=session).update(search=search)
    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "MCTSr-Zero search: 7 replies drafted" in page
    assert "11 of 12 model calls (stopped: budget)" in page
    assert "6.25, 5.50, 4.00" in page


def test_a_sampled_turn_shows_no_search_summary(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = make_session(profile)
    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "MCTSr-Zero" not in page
