"""Table 3 ablation switches: no HBSP (shared table only) and no SOCA (raw preferences,
unprojected credit), applied inside the Counselor; the Ablation parser."""

from __future__ import annotations

import pytest

from counselor_engine import soca
from counselor_engine.backends.base import GenerationParams
from counselor_engine.counselor import (
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
)
from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.hbsp import skill_probabilities
from counselor_engine.memory import MemoryStore
from counselor_engine.simulation.ablation import Ablation
from counselor_engine.skills import PriorTable, skills_for
from counselor_engine.states import ALL_SLOTS
from counselor_engine.tests.fakes import FakeBackend

FAST = GenerationParams(max_new_tokens=8)
UNIFORM = [1.0] * 5
FIVE, FOUR, THREE = [0, 0, 0, 0, 1.0], [0, 0, 0, 1.0, 0], [0, 0, 1.0, 0, 0]


def client() -> ClientState:
    return ClientState("c1", "cbt", 0, 4, memory=MemoryStore(embedder=HashingEmbedder()))


def counselor(backend: FakeBackend, **kwargs) -> Counselor:  # type: ignore[no-untyped-def]
    config = CounselorConfig(
        **{"n_candidates": 1, "generation": FAST, "seed": 5, "memory_k": 0, **kwargs}
    )
    return Counselor(backend, config=config)


async def turn(c: Counselor, text: str) -> DoneEvent:
    events = [e async for e in c.respond(text)]
    assert isinstance(events[-1], DoneEvent), events[-1]
    return events[-1]


async def four_turn_session(use_soca: bool, use_hbsp: bool = True):  # type: ignore[no-untyped-def]
    # Four pointwise rows (n = 1), then turn outcomes: R_0 from four "5"s = 1, R_1 from
    # four "4"s = 0.75, R_2 from four "3"s = 0.5; R_3 has no reaction, so it is not judged
    # (and not imputed). No rating: reward = internal = mean judged outcome = 0.75.
    backend = FakeBackend().script_probabilities(
        *[UNIFORM] * 4, *[FIVE] * 4, *[FOUR] * 4, *[THREE] * 4
    )
    c = counselor(backend, use_soca=use_soca, use_hbsp=use_hbsp)
    state = client()
    c.start_session(state, None)
    for text in ("I feel anxious about work", "It gets worse at night", "I do not know", "Hm"):
        await turn(c, text)
    return state, await c.end_session(None)


async def test_no_soca_credits_the_raw_outcomes_without_projection() -> None:
    _, outcome = await four_turn_session(use_soca=False)
    assert outcome.turn_outcomes == [1.0, 0.75, 0.5, None]
    # By hand, gamma = 0.9, over the judged turns: G_2 = 0.5 + 0.9 * 0.75, G_1 = 0.75 +
    # 0.9 G_2, G_0 = 1 + 0.9 G_1.
    g2 = 0.5 + 0.9 * 0.75
    g1 = 0.75 + 0.9 * g2
    assert outcome.credit[:3] == pytest.approx([1 + 0.9 * g1, g1, g2])
    assert outcome.credit[3] is None
    assert outcome.projected_session_reward == outcome.session_reward == pytest.approx(0.75)
    assert [u.G for u in outcome.posterior_updates] == pytest.approx(outcome.credit[:3])


async def test_full_system_projects_the_same_outcomes() -> None:
    _, outcome = await four_turn_session(use_soca=True)
    assert outcome.turn_outcomes == [1.0, 0.75, 0.5, None]
    assert outcome.credit[:3] == pytest.approx(soca.trajectory_returns([1.0, 0.75, 0.5], 0.75))
    # Eq. 8 spreads the ranks (levels +1, 0, -1): the last judged turn gets less than 0.5.
    projected = soca.ordinal_projection([1.0, 0.75, 0.5])
    assert projected == pytest.approx([1.0, 0.875, 0.375])
    assert outcome.credit[2] == pytest.approx(0.375 + 0.9 * 0.75)
    assert outcome.credit[2] != pytest.approx(0.5 + 0.9 * 0.75)


async def test_no_hbsp_chooses_from_the_shared_table_and_never_updates_posteriors() -> None:
    state, outcome = await four_turn_session(use_soca=True, use_hbsp=False)
    assert outcome.posterior_updates == []
    assert state.posterior.cells() == {}
    assert outcome.evidence.sound  # credit is still computed (it feeds nothing here)
    assert None not in outcome.credit[:3]


async def test_no_hbsp_decision_is_eq3_on_q_with_residuals_removed() -> None:
    c = counselor(FakeBackend(), use_hbsp=False)
    state = client()
    first = skills_for("cbt")[0].id
    for slot in ALL_SLOTS:  # a strongly learned residual that HBSP would follow
        state.posterior.update(slot, first, 50.0, 0.0)
    c.start_session(state, None)
    done = await turn(c, "I feel anxious about work")
    decision = done.decision
    assert decision is not None
    skills = [s.id for s in skills_for("cbt")]
    q = PriorTable.load_default().for_state("cbt", decision.state)
    expected = skill_probabilities(
        [q[s] for s in skills], [0.0] * len(skills), tau=1.0, epsilon=0.05
    )
    assert [decision.records[s].probability for s in skills] == pytest.approx(list(expected))
    assert all(r.draw == 0.0 and r.sd == 0.0 and r.mean == 0.0 for r in decision.records.values())


def test_no_soca_edges_keep_disagreeing_weak_and_cyclic_preferences() -> None:
    support = {(0, 1): (0.8, 0.4), (0, 2): (0.9, 0.8), (1, 2): (0.52, 0.56), (2, 3): (0.5, 0.5)}
    support |= {(0, 3): (0.2, 0.3), (1, 3): (0.5, 0.5)}
    raw = {(e.winner, e.loser): e.weight for e in soca.raw_preference_edges(4, support)}
    # Single-order raw scores: the forward share alone, |2 p - 1|.
    assert raw == pytest.approx({(0, 1): 0.6, (0, 2): 0.8, (1, 2): 0.04, (3, 0): 0.6})
    graph = soca.build_preference_graph(4, support)
    # SOCA drops the pair whose orders disagree (0, 1) and the one under the floor (1, 2).
    assert {(e.winner, e.loser) for e in graph} == {(0, 2), (3, 0)}
    cyclic = {(0, 1): (0.9, 0.9), (1, 2): (0.9, 0.9), (0, 2): (0.1, 0.1)}
    assert len(soca.raw_preference_edges(3, cyclic)) == 3  # 0>1>2>0 kept: no projection
    assert len(soca.build_preference_graph(3, cyclic)) == 2


def test_no_soca_reads_one_order_not_the_two_order_average() -> None:
    # Forward favours 0 (0.6); backward strongly favours 1 (0.2): the mean (0.4) would
    # point to 1, the single order points to 0, and SOCA abstains.
    support = {(0, 1): (0.6, 0.2)}
    assert soca.raw_preference_edges(2, support) == [soca.Edge(0, 1, pytest.approx(0.2))]
    assert soca.raw_delivered(2, support, [3.0, 3.0]) == 0
    assert soca.build_preference_graph(2, support) == []


async def test_no_soca_turn_records_raw_edges_and_delivers_by_raw_share() -> None:
    # n = 3: three pointwise rows, then 3 pairs x 2 orders x 12 criteria rows of (A, B).
    def rows(p_forward: float, p_backward_a: float) -> list[list[float]]:
        return [[p_forward, 1 - p_forward]] * 12 + [[p_backward_a, 1 - p_backward_a]] * 12

    # Pair (0,1): z_0 = 0.8 then 0.4 (orders disagree); (0,2): z_0 = 0.3, 0.2; (1,2): z_1 = 0.7, 0.6.
    pairwise = rows(0.8, 0.6) + rows(0.3, 0.8) + rows(0.7, 0.4)
    for use_soca in (False, True):
        backend = FakeBackend(["zero", "one", "two"]).script_probabilities(
            *[UNIFORM] * 3, *pairwise
        )
        # Soft Eq. 12 shares, so each pair's two orders carry the graded values above.
        c = counselor(backend, n_candidates=3, use_soca=use_soca, judge_votes="soft")
        c.start_session(client(), None)
        group = (await turn(c, "I feel anxious about work")).group
        assert group is not None
        edges = {(e["winner"], e["loser"]): e["weight"] for e in group.edges}
        if use_soca:
            assert edges == pytest.approx({(2, 0): 0.4, (1, 2): 0.2})
            assert group.delivered == 1 and group.depths == [0, 2, 1]
        else:
            # Forward order only: z_0 = 0.8 (0,1); z_0 = 0.3 (0,2); z_1 = 0.7 (1,2).
            assert edges == pytest.approx({(0, 1): 0.6, (2, 0): 0.4, (1, 2): 0.4})
            # Raw shares: 0 -> 0.8 + 0.3, 1 -> 0.2 + 0.7, 2 -> 0.7 + 0.3: 0 wins.
            assert group.delivered == 0 and group.depths == [0, 0, 0]


def test_ablation_parses_and_applies_the_engine_switches() -> None:
    assert Ablation.parse("none") == Ablation()
    both = Ablation.parse("no_hbsp, no-soca")
    assert both == Ablation(no_hbsp=True, no_soca=True) and both.label == "no_hbsp,no_soca"
    config = both.apply(CounselorConfig(n_candidates=2))
    assert (config.use_hbsp, config.use_soca, config.n_candidates) == (False, False, 2)
    assert Ablation.parse("no_lipo").apply(CounselorConfig()).use_hbsp
    assert Ablation().label == "none"


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "empty"), ("no_magic", "unknown"), ("none,no_hbsp", "unknown"), (3, "expected text"),
     ("no_lipo,pairwise_dpo", "exclude")],
)  # fmt: skip
def test_ablation_refuses_bad_text(text, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        Ablation.parse(text)
