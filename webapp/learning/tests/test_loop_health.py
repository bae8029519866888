"""Learning-loop health on the console and in ``manage.py adapters``: judged turns,
empty graphs, order consistency, edges, buffer by modality, time since the last batch,
and the stalled-loop warning (issue 20: the loop can stall silently)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.tests.factories import AdminFactory
from webapp.learning.health import describe, loop_health, pair_counts
from webapp.learning.models import CandidateGroup, TrainingRun
from webapp.learning.tests.helpers import make_groups

pytestmark = pytest.mark.django_db

AGREE = [{"i": 0, "j": 1, "forward": 1.0, "backward": 0.9}]  # one pair, both orders say 0
SPLIT = [{"i": 0, "j": 1, "forward": 1.0, "backward": 0.0}]  # "A" both times: no edge


def judged(count: int, *, support, edges: int, modality: str = "cbt", **fields):  # type: ignore[no-untyped-def]
    extra = {} if edges else {"edges": [], "admissible": False, "buffer_status": "excluded"}
    return make_groups(count, modality, support=support, edge_count=edges, **{**extra, **fields})


def test_pair_counts_need_both_orders_strictly_on_one_side() -> None:
    rows = [
        {"forward": 0.9, "backward": 0.6},
        {"forward": 0.2, "backward": 0.4},
        {"forward": 0.9, "backward": 0.2},
        {"forward": 0.5, "backward": 0.9},
    ]
    assert pair_counts(rows) == (4, 2)


def test_it_counts_judged_turns_empty_graphs_consistency_and_edges_per_day() -> None:
    judged(3, support=AGREE, edges=1)
    judged(2, support=SPLIT, edges=0)
    make_groups(1, support={})  # never judged (stream_first before judging): not counted
    state = loop_health(stall_turns=5)
    [row] = state.rows
    assert (row.version, row.judged_turns, row.edges) == ("base", 5, 3)
    assert row.empty_graph_share == pytest.approx(2 / 5)
    assert row.order_consistency == pytest.approx(3 / 5)
    assert row.day == timezone.localdate()


def test_buffer_counts_only_available_groups_by_modality() -> None:
    judged(2, support=AGREE, edges=1, modality="cbt")
    judged(1, support=AGREE, edges=1, modality="het")
    judged(1, support=SPLIT, edges=0, modality="het")  # excluded: not admissible
    CandidateGroup.objects.filter(modality="cbt").update(buffer_status="consumed")
    assert loop_health().buffer == {"het": (1, 1)}


def test_a_loop_without_edges_for_the_threshold_is_stalled() -> None:
    judged(1, support=AGREE, edges=1)
    judged(4, support=SPLIT, edges=0)
    assert loop_health(stall_turns=4).stalled
    assert not loop_health(stall_turns=5).stalled
    assert loop_health(stall_turns=5).turns_since_edge == 4
    judged(1, support=AGREE, edges=1)
    assert loop_health(stall_turns=1).turns_since_edge == 0


def test_time_since_the_last_admissible_batch() -> None:
    assert loop_health().since_last_batch is None
    assert describe(None) == "never"
    start = timezone.now() - timedelta(hours=3, minutes=5)
    TrainingRun.objects.create(status="succeeded", started_at=start, group_count=32)
    TrainingRun.objects.create(status="failed", started_at=timezone.now(), group_count=0)
    since = loop_health().since_last_batch
    assert since is not None and timedelta(hours=3) < since < timedelta(hours=3, minutes=10)
    assert describe(timedelta(days=2, hours=4, minutes=9)) == "2 d 4 h"
    assert describe(timedelta(hours=3, minutes=5)) == "3 h 5 min"


def test_the_console_warns_when_the_loop_has_stalled(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_LOOP_STALL_TURNS = 3
    client.force_login(AdminFactory())
    judged(2, support=SPLIT, edges=0)
    page = client.get(reverse("console_runs")).content.decode()
    assert 'id="loop-health-table"' in page and "loop-stalled" not in page
    assert "never" in page  # no admissible batch yet
    judged(1, support=SPLIT, edges=0)
    page = client.get(reverse("console_runs")).content.decode()
    assert 'id="loop-stalled"' in page and "3 judged turns in a row" in page
    assert "100.0%" in page  # empty-graph share


def test_manage_adapters_prints_loop_health_and_the_warning(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PSYEVO_LOOP_STALL_TURNS = 2
    judged(1, support=AGREE, edges=1, modality="bt")
    judged(2, support=SPLIT, edges=0)
    out = StringIO()
    call_command("adapters", stdout=out)
    text = out.getvalue()
    assert "LEARNING LOOP" in text and "EMPTY GRAPHS" in text
    assert "bt 1 groups/1 edges" in text
    assert "judged turns since the last edge: 2" in text
    assert "WARNING: the learning loop has stalled" in text
