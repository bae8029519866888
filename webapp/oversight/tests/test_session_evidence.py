"""The H.7 skip record: a session whose evidence was unsound updates no posterior cell,
and the clinician's session review and the admin's posterior inspector say why."""

from __future__ import annotations

import pytest
from django.urls import reverse

from counselor_engine.counselor import SessionOutcome
from counselor_engine.soca import EvidenceCheck, check_session_evidence
from webapp.accounts.tests.factories import AdminFactory
from webapp.counseling import services
from webapp.counseling.models import Session
from webapp.learning.models import PosteriorCell, PosteriorUpdate
from webapp.oversight.tests.helpers import client_profile, make_session

pytestmark = pytest.mark.django_db


def end_with(profile, evidence: EvidenceCheck, *, reward_observed: bool = True) -> Session:  # type: ignore[no-untyped-def]
    """Start a session and end it with an engine outcome that carries ``evidence`` (a
    skipped session brings no posterior updates)."""
    session = services.start_session(profile.user)
    outcome = SessionOutcome(
        turn_outcomes=[0.5, 0.5, 0.5, None], internal_reward=0.5, rating=None,
        session_reward=0.5, projected_session_reward=0.5, credit=[None] * 4,
        posterior_updates=[], recap=[], evidence=evidence, reward_observed=reward_observed,
    )  # fmt: skip
    return services.finish_session(session.pk, outcome, None)


def test_a_tied_session_keeps_its_record_and_moves_no_cell(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = end_with(profile, check_session_evidence([0.5, 0.5, 0.5, None]))

    session.refresh_from_db()
    assert session.outcome["evidence"] == {"judged": 3, "variance": 0.0, "skip": "all_tied"}
    assert session.session_reward == 0.5  # judged outcomes are observations, even if tied
    assert not PosteriorCell.objects.filter(client=profile.user).exists()
    assert not PosteriorUpdate.objects.filter(session=session).exists()

    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert 'id="learning-evidence"' in page
    assert "This session updated no skill posterior" in page
    assert "every judged turn outcome was equal" in page and "<code>all_tied</code>" in page
    assert "3 judged turn outcomes, variance 0" in page


def test_a_failed_judge_leaves_no_session_reward_for_the_history(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = end_with(
        profile, check_session_evidence([None] * 4, judge_failed=True), reward_observed=False
    )

    session.refresh_from_db()
    assert session.outcome["evidence"]["skip"] == "judge_failed"
    assert session.session_reward is None  # the neutral 0.5 was never observed
    assert services.client_state(services.start_session(profile.user)).session_rewards == []

    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "the internal judge failed at session end" in page


def test_a_sound_session_says_how_many_cells_it_updated(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    session = make_session(profile, skill="CBT2")
    Session.objects.filter(pk=session.pk).update(
        outcome={**session.outcome, "evidence": {"judged": 2, "variance": 0.01, "skip": ""}}
    )
    old = make_session(profile, skill="CBT2")  # ended before records existed: no line

    client.force_login(profile.clinician)
    page = client.get(reverse("session_review", args=[session.pk])).content.decode()
    assert "This session updated 1 skill posterior cell." in page
    assert "2 judged turn outcomes, variance 0.01" in page
    page = client.get(reverse("session_review", args=[old.pk])).content.decode()
    assert 'id="learning-evidence"' not in page


def test_the_posterior_inspector_lists_each_session_and_why_it_was_skipped(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    sound = make_session(profile, skill="CBT2")
    Session.objects.filter(pk=sound.pk).update(
        outcome={**sound.outcome, "evidence": {"judged": 2, "variance": 0.25, "skip": ""}}
    )
    skipped = end_with(profile, EvidenceCheck(1, 0.0, "too_few_judged_turns"))
    client.force_login(AdminFactory())

    page = client.get(reverse("console_posteriors", args=[profile.user_id])).content.decode()

    assert 'id="session-evidence"' in page
    sound_row = page.split(f'data-session="{sound.pk}"')[1].split("</tr>")[0]
    skipped_row = page.split(f'data-session="{skipped.pk}"')[1].split("</tr>")[0]
    assert "<td>2</td><td>0.25</td><td>1</td>" in sound_row
    assert "fewer than two turns had a judged outcome" in skipped_row
    assert "too_few_judged_turns" in skipped_row and "<td>0</td>" in skipped_row
