"""The learning loop turns on the default model (issue 20, item 5): simulated sessions
with SmolLM2 -> admissible groups -> a LiPO round -> validation -> a clinician's approval
-> a new session served by the new version. The driver is the bench's
(``bench.bench_loop.run_loop``: the product's own pieces, in order); figures from a run
are in bench/RESULTS.md, section "learning loop (smollm2-135m-instruct)"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_loop import LoopPlan, run_loop

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),  # the lab's ORM work runs on other threads
    pytest.mark.timeout(3600),
]

# Scaled down from App. C (320 edges from >= 32 groups, >= 20% per modality): two short
# sessions with N = 3 give about a dozen edges. Training keeps the product's settings.
SMALL_BATCH = {
    "batch_edges": 6,
    "min_groups": 2,
    "modalities": ["cbt", "bt", "het", "pdt", "pmt"],
    "min_share": 0.0,
    "sessions_per_round": 1000,  # the driver starts the round, not the schedule
    "max_length": 384,
    "heldout_groups": 0,  # too few groups to hold any out (bench_loop.LOOP_LIPO says why)
    "side_by_side": 1,
    "side_by_side_tokens": 24,
    "arena_clients": 0,  # the arena has its own test
}
PLAN = LoopPlan(
    clients=2, sessions=1, max_turns=3, candidates=3, max_new_tokens=40, lipo=SMALL_BATCH
)


def test_it_learns_from_judged_turns_and_serves_the_approved_version(tmp_path: Path) -> None:
    result = run_loop(PLAN, tmp_path)

    # Real judged turns formed edges (the contrastive evaluator on SmolLM2).
    assert result.judged_turns > 0 and result.edges > 0, result
    assert result.admissible_groups >= SMALL_BATCH["min_groups"], result
    # An admissible batch was claimed, exactly the configured size.
    assert (result.batch_edges, result.batch_groups >= 2) == (6, True), result
    # The round passed every validation check and waited for the gate.
    assert result.outcome == "pending_approval", (result.outcome, result.error, result.checks)
    ran = {name: status for name, status in result.checks.items() if status != "skipped"}
    assert set(ran.values()) == {"pass"} and len(ran) >= 4, result.checks
    # The clinician's approval activated it; the next session pinned it and every group
    # it stored names it as the generating version.
    assert result.version_status == "active"
    assert result.served_sessions == [result.version]
    assert result.served_groups and set(result.served_groups) == {result.version}
