"""Simulated clients stay apart: consoles, the evidence buffer, the scheduler and rounds
leave them out unless a run allowed training; and the lab's report pages."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from training_worker.round import heldout_groups, run_round
from webapp.accounts.models import ClientProfile, Role, User
from webapp.accounts.tests.factories import (
    AdminFactory,
    ClientProfileFactory,
    ClinicianFactory,
)
from webapp.counseling.models import Course, Session
from webapp.learning import simlab
from webapp.learning.models import (
    CandidateGroup,
    LearningScope,
    PosteriorCell,
    SimulationClient,
    SimulationReport,
    SimulationRun,
    TrainingRun,
)
from webapp.learning.schedule import available_graphs, note_session_completed, simulation_of
from webapp.learning.tests.helpers import make_evidence, make_groups

pytestmark = pytest.mark.django_db


def simulated(groups: list[CandidateGroup], *, training: bool = False) -> list[CandidateGroup]:
    """Turn the (single) client of ``groups`` into a simulated one."""
    ClientProfile.objects.filter(user_id=groups[0].client_id).update(
        simulated=True, clinician=None, simulated_training=training
    )
    return groups


def lab_client(ablation: list[str] | None = None, *, training: bool = False) -> User:
    run = SimulationRun.objects.create(ablation=ablation or [], allow_training=training)
    user = User.objects.create(username=f"sim-{uuid.uuid4().hex[:8]}", role=Role.CLIENT)
    ClientProfile.objects.create(
        user=user, modality="cbt", simulated=True, simulated_training=training
    )
    SimulationClient.objects.create(
        run=run, user=user, profile_id="cbt-1", intent="x", modality="cbt"
    )
    return user


def ended_session(user: User) -> Session:
    course = Course.objects.create(client=user, modality="cbt")
    return Session.objects.create(
        course=course, client=user, index=0, status="ended", ended_at=timezone.now()
    )


# -- the consoles -------------------------------------------------------------------------


def test_a_simulated_client_can_never_be_assigned_to_a_clinician() -> None:
    profile = ClientProfileFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        ClientProfile.objects.filter(pk=profile.pk).update(simulated=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        ClientProfileFactory(simulated_training=True)  # only simulated clients may train


def test_clinicians_and_admins_do_not_see_simulated_clients(client):  # type: ignore[no-untyped-def]
    real = ClientProfileFactory(user__username="real-person")
    sim = lab_client()
    sim.username = "synthetic-person"
    sim.save()
    client.force_login(real.clinician)
    page = client.get(reverse("clinician_home")).content.decode()
    assert "real-person" in page and "synthetic-person" not in page
    client.force_login(AdminFactory())
    page = client.get(reverse("console_clients")).content.decode()
    assert "real-person" in page and "synthetic-person" not in page


def test_the_population_view_leaves_simulated_clients_out() -> None:
    from webapp.oversight import posteriors

    real, sim = ClientProfileFactory(modality="het").user, lab_client()
    ClientProfile.objects.filter(user=sim).update(modality="het")
    for user in (real, sim):
        PosteriorCell.objects.create(
            client=user, modality="het", state_slot="formulation:early:anxiety", skill="RF",
            mean=0.1, precision=2.0, n=1,
        )  # fmt: skip
    assert [c.pk for c in posteriors.population("het").clients] == [real.pk]


# -- evidence and the scheduler -------------------------------------------------------------


def test_the_buffer_leaves_simulated_evidence_out_unless_the_run_allowed_it(lipo_settings):  # type: ignore[no-untyped-def]
    real = make_evidence()
    [sim] = simulated(make_groups(1, "cbt"))
    assert {g.pk for g in available_graphs()} == {g.pk for g in real}
    held = {g.key for g in heldout_groups([])}
    assert sim.group_key not in held and real[-1].group_key in held

    ClientProfile.objects.filter(user_id=sim.client_id).update(simulated_training=True)
    assert sim.pk in {g.pk for g in available_graphs()}
    assert sim.group_key in {g.key for g in heldout_groups([])}


def test_a_round_never_claims_simulated_evidence(lipo_settings):  # type: ignore[no-untyped-def]
    from training_worker.round import Fence, begin_attempt, claim

    sim = simulated(make_groups(3, "cbt")) + simulated(make_groups(3, "bt"))
    make_evidence(3)  # real clients, both modalities: admissible on their own
    run = TrainingRun.objects.create()
    fence = Fence(run.pk, begin_attempt(run.pk) or 0)
    assert claim(fence) is not None
    claimed = set(TrainingRun.objects.get(pk=run.pk).batch)
    assert claimed and not claimed & {g.pk for g in sim}


def test_only_simulated_evidence_makes_a_round_skip(lipo_settings):  # type: ignore[no-untyped-def]
    simulated(make_groups(3, "cbt"))
    simulated(make_groups(3, "bt"))
    run = TrainingRun.objects.create()
    assert run_round(run.pk) == "skipped"
    assert not CandidateGroup.objects.filter(buffer_status="reserved").exists()


def test_simulated_sessions_do_not_move_the_scheduler_by_default(lipo_settings):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, sessions_per_round=1)
    make_evidence()
    session = ended_session(lab_client())
    assert note_session_completed(session) is False
    assert not TrainingRun.objects.exists()
    assert not LearningScope.objects.filter(completed_sessions__gt=0).exists()


def test_allowed_training_counts_and_records_the_runs_loss(
    lipo_settings, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, sessions_per_round=1)
    make_evidence()
    user = lab_client(["pairwise_dpo"], training=True)
    with django_capture_on_commit_callbacks():
        assert note_session_completed(ended_session(user)) is True
    run = TrainingRun.objects.get()
    assert run.config["loss"] == "pairwise_dpo"
    assert run.config["simulation_run"] == user.simulation.run_id


def test_no_lipo_keeps_the_adapter_fixed_even_with_training_allowed(lipo_settings):  # type: ignore[no-untyped-def]
    lipo_settings.LIPO = replace(lipo_settings.LIPO, sessions_per_round=1)
    make_evidence()
    user = lab_client(["no_lipo"], training=True)
    lab = simulation_of(ended_session(user))
    assert lab is not None and lab.trains is False
    assert note_session_completed(ended_session(lab_client(["no_lipo"], training=True))) is False
    assert not TrainingRun.objects.exists()
    assert simulation_of(ended_session(ClientProfileFactory().user)) is None


# -- the engine switches ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "ablation", "expected"),
    [
        ("sample", "none", {"candidate_strategy": "sample", "use_hbsp": True, "use_soca": True}),
        ("mctsr", "no_hbsp", {"candidate_strategy": "mctsr", "use_hbsp": False, "use_soca": True}),
        ("sample", "no_soca,no_hbsp", {"use_hbsp": False, "use_soca": False}),
    ],
)
def test_ablations_map_onto_the_engine_switches(strategy, ablation, expected) -> None:  # type: ignore[no-untyped-def]
    from counselor_engine.simulation import Ablation

    overrides = simlab._engine_overrides(strategy, Ablation.parse(ablation))
    assert overrides.items() >= expected.items()


# -- the report pages -------------------------------------------------------------------


@pytest.fixture
def finished_run() -> SimulationRun:
    from webapp.learning import simreport

    user = lab_client()
    link = user.simulation
    run = link.run
    run.parameters = {"clients": 1, "sessions": 2, "max_turns": 2}
    run.save()
    for index, (state, value) in enumerate(
        (("delayed/moderate/t0", 4.0), ("proactive/high/t3", 8.0))
    ):
        SimulationReport.objects.create(
            run=run, client=link, session_index=index, state_key=state, turns=2,
            metrics={"c_shared": value, "c_spec": value, "l_shared": value, "l_spec": value,
                     "overall": value, "pass_all": 0.0},
            passed={"client": index == 1, "supervisor": True, "counselor": False},
            session_reward=0.5,
        )  # fmt: skip
    summary = simreport.summarise(run)
    SimulationRun.objects.filter(pk=run.pk).update(
        status="succeeded", report=summary, finished_at=timezone.now()
    )
    run.refresh_from_db()
    return run


def test_the_summary_has_metric_families_pass_rates_and_allocation(finished_run) -> None:  # type: ignore[no-untyped-def]
    summary = finished_run.report
    assert summary["families"] == ["c_shared", "c_spec", "l_shared", "l_spec", "overall"]
    assert [r["overall"] for r in summary["by_session"]] == [4.0, 8.0]
    assert summary["pass_rates"] == {"client": 0.5, "supervisor": 1.0, "counselor": 0.0}
    counts = summary["allocation"]["sessions"]
    assert len(counts) == 24 and counts["delayed/moderate/t0"] == counts["proactive/high/t3"] == 1


def test_staff_read_the_report_page_with_its_plots(client, finished_run) -> None:  # type: ignore[no-untyped-def]
    for user in (ClinicianFactory(), AdminFactory()):
        client.force_login(user)
        listing = client.get(reverse("learning:simulations")).content.decode()
        assert f"Run {finished_run.pk}" in listing
        page = client.get(reverse("learning:simulation", args=[finished_run.pk])).content.decode()
        assert page.count('<img class="plot" src="data:image/svg+xml;base64,') == 3
        assert "proactive/high/t3" in page and "supervisor" in page


def test_clients_cannot_read_simulation_reports(client, finished_run) -> None:  # type: ignore[no-untyped-def]
    client.force_login(ClientProfileFactory().user)
    for url in (
        reverse("learning:simulations"),
        reverse("learning:simulation", args=[finished_run.pk]),
    ):
        assert client.get(url).status_code in (403, 404)
