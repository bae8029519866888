"""The admin's posterior inspector: replayed past states, heatmaps, the Fig. 6 diff, cell
history, and the population disagreement view (Fig. 3)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from django.urls import reverse

from counselor_engine.skills import PriorTable
from webapp.accounts.tests.factories import AdminFactory
from webapp.learning.models import PosteriorCell
from webapp.lib import plots
from webapp.oversight import posteriors
from webapp.oversight.models import AuditEvent
from webapp.oversight.tests.helpers import SLOT, client_profile, make_session

pytestmark = pytest.mark.django_db


def heatmap_src(page: str) -> str:
    match = re.search(r'id="heatmap-after" src="([^"]+)"', page)
    assert match, "no heatmap on the page"
    return match.group(1)


def cell_text(page: str, slot: str, skill: str) -> str:
    row = re.search(rf'<tr[^>]*data-slot="{re.escape(slot)}">(.*?)</tr>', page, re.S)
    assert row
    cell = re.search(rf'data-skill="{skill}"><a [^>]*>([^<]+)</a>', row.group(1))
    assert cell
    return cell.group(1)


def test_a_past_state_is_the_replay_of_updates_up_to_that_session():  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    first = make_session(profile, skill="CBT1", credit=0.9)
    make_session(profile, skill="CBT1", credit=0.1)
    make_session(profile, skill="CBT2", credit=0.5)
    points = posteriors.checkpoints(profile.user)
    assert [p.key for p in points][:2] == ["start", str(first.pk)] and len(points) == 4
    r = posteriors.SLOT_INDEX[SLOT]
    start = posteriors.snapshot(profile.user, "cbt", points[0])
    assert np.all(start.mean == 0.0) and np.all(start.precision == 4.0)
    after_first = posteriors.snapshot(profile.user, "cbt", points[1])
    update = first.posterior_updates.get()
    assert after_first.mean[r, 0] == update.mean_after and after_first.n[r, 0] == 1
    assert after_first.mean[r, 1] == 0.0
    latest = posteriors.snapshot(profile.user, "cbt", points[-1])
    for cell in PosteriorCell.objects.filter(client=profile.user):
        c = latest.skills.index(cell.skill)
        assert latest.mean[r, c] == pytest.approx(cell.mean)
        assert latest.precision[r, c] == pytest.approx(cell.precision)
        assert latest.n[r, c] == cell.n


def test_ranks_ties_and_rank_change():  # type: ignore[no-untyped-def]
    scores = np.array([[0.5, 0.2, 0.5, 0.1], [0.1, 0.2, 0.3, 0.4]])
    assert posteriors.top_skills(scores) == [None, 3]
    assert posteriors.average_ranks(scores).tolist() == [[1.5, 3.0, 1.5, 4.0], [4.0, 3.0, 2.0, 1.0]]


def test_disagreement_leaves_tied_slots_out():  # type: ignore[no-untyped-def]
    a = np.array([0, 1, 2, -1])
    b = np.array([0, 2, -1, 3])
    assert posteriors.disagreement(a, b) == 0.5  # slots 0 and 1 count; 2 and 3 are ties
    assert posteriors.disagreement(np.array([-1]), np.array([0])) is None


def test_the_admin_sees_the_heatmap_change_after_a_session(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    make_session(profile, skill="CBT4", credit=0.9)
    admin = AdminFactory()
    client.force_login(admin)
    url = reverse("console_posteriors", args=[profile.user_id])
    before = client.get(url).content.decode()
    assert "Before the first session (prior)" in before and "After session 1" in before
    score_before = cell_text(before, SLOT, "CBT4")
    make_session(profile, skill="CBT4", credit=1.0)
    after = client.get(url).content.decode()
    assert heatmap_src(after) != heatmap_src(before)
    assert cell_text(after, SLOT, "CBT4") != score_before
    q = PriorTable.load_default().value("cbt", SLOT, "CBT4")
    cell = PosteriorCell.objects.get(client=profile.user, state_slot=SLOT, skill="CBT4")
    assert cell_text(after, SLOT, "CBT4") == f"{q + cell.mean:.3f}"
    assert (
        AuditEvent.objects.filter(
            action="posterior.read", actor=admin, subject=profile.user
        ).count()
        == 2
    )


def test_comparing_two_sessions_shows_the_rank_diff(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    q = PriorTable.load_default().for_state("cbt", SLOT)
    underdog = min(q, key=q.get)
    first = make_session(profile, skill=underdog, credit=5.0)  # a huge return lifts it to the top
    client.force_login(AdminFactory())
    url = reverse("console_posteriors", args=[profile.user_id])
    page = client.get(url, {"before": "start", "after": str(first.pk)}).content.decode()
    assert page.count('<img class="plot"') == 3  # before, after and the rank diff
    assert "Rank before − rank after" in page
    row = re.search(rf'<tr class="changed" data-slot="{re.escape(SLOT)}">', page)
    assert row and "changed</span>" in page
    assert re.search(r"differs from before the first session \(prior\) in <strong>1</strong>", page)


def test_same_checkpoints_show_one_heatmap_and_no_diff(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    client.force_login(AdminFactory())
    page = client.get(reverse("console_posteriors", args=[profile.user_id])).content.decode()
    assert page.count('<img class="plot"') == 1 and "Rank before" not in page
    assert "<strong>0</strong> cells updated" in page


def test_the_cell_history_lists_every_update(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    make_session(profile, skill="CBT3", credit=0.9)
    make_session(profile, skill="CBT3", credit=0.2)
    client.force_login(AdminFactory())
    url = reverse("console_posterior_cell", args=[profile.user_id])
    page = client.get(url, {"slot": SLOT, "skill": "CBT3"}).content.decode()
    assert page.count('<tr><th scope="row">') == 2
    assert "0.900" in page and "0.200" in page and 'src="data:image/svg+xml' in page
    assert client.get(url, {"slot": "nowhere", "skill": "CBT3"}).status_code == 404
    assert client.get(url, {"slot": SLOT, "skill": "HET1"}).status_code == 404


def test_the_population_view_measures_pairwise_disagreement(client):  # type: ignore[no-untyped-def]
    q = PriorTable.load_default().for_state("het", SLOT)
    underdog = min(q, key=q.get)
    lifted, plain = client_profile("het"), client_profile("het")
    make_session(lifted, skill=underdog, credit=5.0)
    make_session(plain, skill=max(q, key=q.get), credit=0.5)
    client_profile("cbt")  # another modality: not in the HET view
    pop = posteriors.population("het")
    assert {c.pk for c in pop.clients} == {lifted.user_id, plain.user_id}
    untied = int(((pop.tops[0] >= 0) & (pop.tops[1] >= 0)).sum())  # ties leave the denominator
    assert len(pop.pairs) == 1 and pop.pairs[0][2] == pytest.approx(1 / untied)
    client.force_login(AdminFactory())
    page = client.get(reverse("console_population"), {"modality": "het"}).content.decode()
    assert "2 clients, 1 pair." in page
    assert f"Median disagreement <strong>{100 / untied:.1f}%</strong>" in page
    event = AuditEvent.objects.get(action="posterior.read", target="population:het")
    assert sorted(event.detail["clients"]) == sorted([lifted.user_id, plain.user_id])


def test_plots_are_cached_per_data_version(client, monkeypatch):  # type: ignore[no-untyped-def]
    calls = []
    real = plots.heatmap
    monkeypatch.setattr(plots, "heatmap", lambda *a, **k: calls.append(1) or real(*a, **k))
    profile = client_profile("cbt")
    make_session(profile)
    client.force_login(AdminFactory())
    url = reverse("console_posteriors", args=[profile.user_id])
    first = client.get(url).content.decode()
    assert len(calls) == 2  # the prior and the latest state
    second = client.get(url).content.decode()
    assert len(calls) == 2 and heatmap_src(first) == heatmap_src(second)
    make_session(profile, credit=0.1)
    client.get(url)
    assert len(calls) == 4


def test_labels_in_plots_are_escaped():  # type: ignore[no-untyped-def]
    svg = plots.disagreement(np.zeros((1, 54), dtype=int), ["<script>x</script>"], [], "cbt")
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_the_console_leads_to_every_client_and_page(client):  # type: ignore[no-untyped-def]
    profile = client_profile("bt")
    make_session(profile)
    client.force_login(AdminFactory())
    home = client.get(reverse("admin_home")).content.decode()
    for name in (
        "console_clients",
        "console_population",
        "console_runs",
        "console_lineage",
        "console_audit",
    ):
        assert reverse(name) in home
    page = client.get(reverse("console_clients")).content.decode()
    assert reverse("console_posteriors", args=[profile.user_id]) in page
    assert reverse("console_erase", args=[profile.user_id]) in page
    assert profile.clinician.username in page and "Behavioural therapy" in page
