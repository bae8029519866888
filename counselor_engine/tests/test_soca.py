"""SOCA: support shares (Eq. 12), the preference graph (Eq. 7), ordinal credit (Eq. 8-9)."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.soca import (
    Edge,
    build_preference_graph,
    criterion_vote,
    edge_strength,
    graph_depths,
    midranks,
    ordinal_levels,
    ordinal_projection,
    projected_session_reward,
    select_delivered,
    support_share,
    trajectory_returns,
    vote_share,
)

probability = st.floats(0, 1)
# Scores on a 1/1000 grid: exact ties are common and affine maps do not merge them.
grid_scores = st.lists(st.integers(0, 1000).map(lambda k: k / 1000), min_size=1, max_size=25)


def _support(
    n: int, values: list[tuple[float, float]]
) -> dict[tuple[int, int], tuple[float, float]]:
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return dict(zip(pairs, values, strict=True))


@st.composite
def supports(draw: st.DrawFn) -> tuple[int, dict[tuple[int, int], tuple[float, float]]]:
    n = draw(st.integers(1, 8))
    level = st.sampled_from([0.0, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 1.0]) | probability
    values = draw(
        st.lists(st.tuples(level, level), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2)
    )
    return n, _support(n, values)


# --- Eq. 12 ------------------------------------------------------------------------------


def test_support_share_is_the_weighted_share_of_favouring_criteria() -> None:
    assert support_share([1, 0, 1], [2.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert support_share([1] * 12, [1.0] * 12) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(probability, st.floats(0.1, 5)), min_size=1, max_size=5))
def test_soft_judgments_are_the_expectation_of_eq12(criteria: list[tuple[float, float]]) -> None:
    probs, weights = zip(*criteria, strict=True)
    expected = 0.0
    for z in itertools.product([0, 1], repeat=len(probs)):
        chance = math.prod(p if bit else 1 - p for p, bit in zip(probs, z, strict=True))
        expected += chance * support_share(z, weights)
    assert support_share(probs, weights) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("judgments", "weights", "name"),
    [
        ([1, 0], [1.0], "weights"),
        ([1, 0], [1.0, 0.0], "weights"),
        ([1, 0], [1.0, math.inf], "weights"),
        ([1, 1.5], [1.0, 1.0], "judgments"),
        ([1, math.nan], [1.0, 1.0], "judgments"),
        ([], [], "judgments"),
    ],
)
def test_support_share_refuses_bad_input(
    judgments: list[float], weights: list[float], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        support_share(judgments, weights)


def test_a_criterion_votes_for_the_side_with_the_higher_probability() -> None:
    assert criterion_vote(0.51, 0.49) == 1.0
    assert criterion_vote(0.2, 0.8) == 0.0
    assert criterion_vote(0.5, 0.5) is None  # an exact tie is no vote


def test_binary_share_counts_weight_of_the_votes_for_i() -> None:
    assert vote_share([1.0, 0.0, 1.0], [2.0, 1.0, 1.0]) == pytest.approx(0.75)
    # The tied criterion (weight 5) leaves numerator and denominator alike.
    assert vote_share([1.0, None, 0.0], [3.0, 5.0, 1.0]) == pytest.approx(0.75)
    assert vote_share([None, None], [1.0, 1.0]) == 0.5  # nobody voted: Eq. 7 abstains
    with pytest.raises(ValueError, match="votes"):
        vote_share([0.7], [1.0])
    with pytest.raises(ValueError, match="weights"):
        vote_share([1.0], [1.0, 2.0])


near_half = st.sampled_from([0.5, 0.5 - 1e-12, 0.5 + 1e-12, 0.49, 0.51]) | probability


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(near_half, st.floats(0.1, 5)), min_size=1, max_size=12))
def test_binary_shares_of_i_and_j_sum_to_one_and_ties_never_count(
    criteria: list[tuple[float, float]],
) -> None:
    probs, weights = zip(*criteria, strict=True)
    for_i = [criterion_vote(p, 1.0 - p) for p in probs]
    for_j = [criterion_vote(1.0 - p, p) for p in probs]
    share_i, share_j = vote_share(for_i, weights), vote_share(for_j, weights)
    assert share_i + share_j == pytest.approx(1.0)
    voters = [(w, v) for w, v in zip(weights, for_i, strict=True) if v is not None]
    if voters:  # the share among the criteria that took a side
        expected = sum(w * v for w, v in voters) / sum(w for w, _ in voters)
        assert share_i == pytest.approx(expected)
    else:
        assert share_i == 0.5
    # All-or-nothing per criterion: a unanimous judge gives a full share however unsure
    # each criterion was.
    if voters and all(v == 1.0 for _, v in voters):
        assert share_i == 1.0


def test_unsure_unanimous_criteria_clear_the_floor_only_as_binary_votes() -> None:
    """The issue's case: every criterion leans to i by a hair. Soft shares sit at 0.52
    and c = 0.04 falls under the 0.1 floor; binary votes give p = 1 and c = 1."""
    weights = [1.0] * 12
    soft = support_share([0.52] * 12, weights)
    binary = vote_share([criterion_vote(0.52, 0.48)] * 12, weights)
    soft_graph = build_preference_graph(2, {(0, 1): (soft, soft)})
    binary_graph = build_preference_graph(2, {(0, 1): (binary, binary)})
    assert soft_graph == []
    assert binary_graph == [Edge(0, 1, 1.0)]


# --- Eq. 7 -------------------------------------------------------------------------------


def test_edge_strength_needs_both_orders_strictly_on_one_side() -> None:
    assert edge_strength(0.9, 0.75) == (True, 2 * 0.75 - 1)
    assert edge_strength(0.1, 0.3) == (False, 2 * (1 - 0.3) - 1)
    assert edge_strength(0.9, 0.4) is None  # the orders disagree
    assert edge_strength(0.5, 0.9) is None  # an exact tie abstains
    with pytest.raises(ValueError, match="p_forward"):
        edge_strength(1.2, 0.9)


def test_the_graph_keeps_strong_consistent_edges() -> None:
    support = _support(3, [(0.9, 0.8), (0.95, 0.85), (0.56, 0.52)])  # (0,1) (0,2) (1,2)
    edges = build_preference_graph(3, support)
    assert [(e.winner, e.loser) for e in edges] == [(0, 2), (0, 1)]
    assert [e.weight for e in edges] == pytest.approx([0.7, 0.6])


def test_the_floor_discards_weak_edges_and_keeps_one_at_the_floor() -> None:
    support = _support(2, [(0.75, 0.8)])  # strength exactly 0.5
    assert build_preference_graph(2, support, floor=0.5) == [Edge(0, 1, 0.5)]
    assert build_preference_graph(2, support, floor=0.6) == []


def test_an_edge_that_would_close_a_cycle_is_skipped() -> None:
    # 0 > 1 (0.8), 1 > 2 (0.6), 2 > 0 (0.4): the weakest edge closes the cycle.
    support = _support(3, [(0.9, 0.9), (0.3, 0.3), (0.8, 0.8)])
    edges = build_preference_graph(3, support)
    assert [(e.winner, e.loser) for e in edges] == [(0, 1), (1, 2)]


def test_equal_strengths_are_ordered_by_a_sha256_of_group_and_pair() -> None:
    # A 3-cycle with equal strengths: whichever edge comes last in the hash order is dropped.
    support = _support(3, [(0.8, 0.8), (0.2, 0.2), (0.8, 0.8)])  # 0>1, 2>0, 1>2
    pair_edge = {(0, 1): (0, 1), (0, 2): (2, 0), (1, 2): (1, 2)}
    for group in ["g-1", "g-2", "client-7/turn-3", ""]:
        order = sorted(
            pair_edge, key=lambda p: hashlib.sha256(f"{group}:{p[0]}:{p[1]}".encode()).digest()
        )
        edges = build_preference_graph(3, support, group_id=group)
        assert [(e.winner, e.loser) for e in edges] == [pair_edge[p] for p in order[:2]]


@settings(max_examples=150, deadline=None)
@given(supports(), st.sampled_from([0.0, 0.1, 0.3]))
def test_graphs_are_acyclic_and_every_edge_satisfies_eq7(
    case: tuple[int, dict[tuple[int, int], tuple[float, float]]], floor: float
) -> None:
    n, support = case
    edges = build_preference_graph(n, support, floor=floor, group_id="g")
    graph_depths(n, edges)  # raises on a cycle
    assert _is_acyclic(n, edges)
    seen = set()
    for edge in edges:
        i, j = sorted((edge.winner, edge.loser))
        assert (i, j) not in seen
        seen.add((i, j))
        p_f, p_b = support[(i, j)]
        if edge.winner == i:
            assert p_f > 0.5 and p_b > 0.5 and edge.weight == 2 * min(p_f, p_b) - 1
        else:
            assert p_f < 0.5 and p_b < 0.5 and edge.weight == 2 * min(1 - p_f, 1 - p_b) - 1
        assert edge.weight >= floor and edge.weight > 0
    weights = [e.weight for e in edges]
    assert weights == sorted(weights, reverse=True)  # admitted in decreasing strength
    # Maximal: every consistent edge left out would close a cycle in the final graph.
    for (i, j), (p_f, p_b) in support.items():
        verdict = edge_strength(p_f, p_b)
        if verdict is not None and verdict[1] >= floor and (i, j) not in seen:
            winner, loser = (i, j) if verdict[0] else (j, i)
            assert _reaches(n, edges, loser, winner)


def _reaches(n: int, edges: list[Edge], start: int, goal: int) -> bool:
    frontier, seen = [start], {start}
    while frontier:
        node = frontier.pop()
        if node == goal:
            return True
        for e in edges:
            if e.winner == node and e.loser not in seen:
                seen.add(e.loser)
                frontier.append(e.loser)
    return False


def _is_acyclic(n: int, edges: list[Edge]) -> bool:
    return not any(_reaches(n, edges, e.loser, e.winner) for e in edges)


@pytest.mark.parametrize(
    ("n", "support", "name"),
    [
        (0, {}, "n"),
        (3, _support(2, [(0.9, 0.9)]), "support"),
        (2, {(1, 0): (0.9, 0.9)}, "support"),
        (2, {(0, 1): (0.9, math.nan)}, "p_backward"),
        (2, {(0, 1): (0.9, 1.2)}, "p_backward"),
        (2, {(0, 1): (0.9,)}, "support"),
    ],
)
def test_the_graph_refuses_bad_support(n: int, support: dict, name: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=name):
        build_preference_graph(n, support)


def test_depth_is_the_longest_path_to_a_sink() -> None:
    edges = [Edge(0, 1, 0.5), Edge(1, 2, 0.5), Edge(0, 2, 0.5), Edge(3, 2, 0.5)]
    assert graph_depths(5, edges) == [2, 1, 0, 1, 0]


def test_depths_refuse_cycles_and_bad_indices() -> None:
    with pytest.raises(ValueError, match="cycle"):
        graph_depths(2, [Edge(0, 1, 0.5), Edge(1, 0, 0.5)])
    with pytest.raises(ValueError, match="out of range"):
        graph_depths(2, [Edge(0, 2, 0.5)])
    with pytest.raises(ValueError, match="self-loop"):
        graph_depths(2, [Edge(1, 1, 0.5)])


def test_delivery_prefers_depth_then_pointwise_then_index() -> None:
    edges = [Edge(1, 0, 0.5), Edge(2, 0, 0.5), Edge(3, 4, 0.5)]
    assert select_delivered(5, edges, [0.9, 0.2, 0.4, 0.3, 1.0]) == 2  # depth 1, best score
    assert select_delivered(5, edges, [0.9, 0.4, 0.4, 0.4, 1.0]) == 1  # full tie: lower index


def test_an_empty_graph_falls_back_to_pointwise() -> None:
    assert select_delivered(3, [], [0.2, 0.7, 0.7]) == 1


def test_delivery_refuses_bad_scores() -> None:
    with pytest.raises(ValueError, match="pointwise"):
        select_delivered(2, [], [0.2, math.nan])
    with pytest.raises(ValueError, match="pointwise"):
        select_delivered(3, [], [0.2, 0.3])


# --- Eq. 8 -------------------------------------------------------------------------------


def test_midranks_are_zero_based_and_tie_aware() -> None:
    assert midranks([0.2, 0.5, 0.5, 0.9]) == [0.0, 1.5, 1.5, 3.0]
    assert midranks([0.7, 0.7, 0.7]) == [1.0, 1.0, 1.0]


def test_ordinal_levels_follow_eq8() -> None:
    assert ordinal_levels([0.4]) == [0.0]
    assert ordinal_levels([0.9, 0.1]) == [1.0, -1.0]  # K = 2
    assert ordinal_levels([0.2, 0.5, 0.5, 0.9]) == [-1.0, 0.0, 0.0, 1.0]
    assert ordinal_levels([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == [-1, -1, 0, 0, 1, 1]


def test_projection_matches_a_hand_computation() -> None:
    # levels -1, 0, 0, 1; mean 0.525; the top value clips at 1, so xi = 0.025 / 3.
    projected = ordinal_projection([0.2, 0.5, 0.5, 0.9])
    assert projected == pytest.approx([1 / 30, 0.5 + 1 / 30, 0.5 + 1 / 30, 1.0], abs=1e-12)


def test_one_turn_or_a_full_tie_keeps_the_raw_values() -> None:
    assert ordinal_projection([0.37]) == [0.37]
    assert ordinal_projection([0.5] * 6) == [0.5] * 6


@settings(max_examples=200, deadline=None)
@given(st.lists(probability, min_size=1, max_size=30), st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_projection_preserves_the_mean_and_the_order(scores: list[float], scale: float) -> None:
    projected = ordinal_projection(scores, scale=scale)
    assert abs(np.mean(projected) - np.mean(scores)) <= 1e-12
    assert all(0.0 <= r <= 1.0 for r in projected)
    for a, b in itertools.combinations(range(len(scores)), 2):
        if scores[a] == scores[b]:
            assert projected[a] == projected[b]
        elif scores[a] < scores[b]:
            assert projected[a] <= projected[b]


transforms = st.sampled_from(
    [
        lambda x: x**3,
        math.sqrt,
        lambda x: 1 / (1 + math.exp(-12 * (x - 0.5))),
        lambda x: 5 * x - 2,
        lambda x: math.log1p(x),
    ]
)


@settings(max_examples=150, deadline=None)
@given(grid_scores, transforms)
def test_ordinal_levels_are_invariant_to_increasing_transforms(
    scores: list[float], f: Callable[[float], float]
) -> None:
    """Proposition 1: ranks and tiers depend only on the order of the scores."""
    assert ordinal_levels([f(x) for x in scores]) == ordinal_levels(scores)


@settings(max_examples=150, deadline=None)
@given(grid_scores, st.integers(1, 10))
def test_projection_depends_only_on_order_and_mean(scores: list[float], tenths: int) -> None:
    """Proposition 1 for the whole projection: a strictly increasing map that keeps the mean
    (a contraction towards it) leaves every projected value unchanged."""
    mean = sum(scores) / len(scores)
    squeezed = [mean + tenths / 10 * (x - mean) for x in scores]
    assert ordinal_projection(squeezed) == pytest.approx(ordinal_projection(scores), abs=1e-12)


@pytest.mark.parametrize("scores", [[], [0.2, 1.1], [-0.1], [0.5, math.nan], [math.inf]])
def test_projection_refuses_bad_scores(scores: list[float]) -> None:
    with pytest.raises(ValueError, match="scores"):
        ordinal_projection(scores)


# --- Eq. 9 -------------------------------------------------------------------------------


def test_returns_accumulate_backwards_from_the_session_reward() -> None:
    outcomes, reward = [0.3, 0.6, 0.5], 0.7
    r = ordinal_projection(outcomes)
    g3 = r[2] + 0.9 * reward
    g2 = r[1] + 0.9 * g3
    assert trajectory_returns(outcomes, reward) == pytest.approx([r[0] + 0.9 * g2, g2, g3])
    assert trajectory_returns([0.4], 0.5) == pytest.approx([0.4 + 0.9 * 0.5])


@settings(max_examples=100, deadline=None)
@given(st.lists(probability, min_size=1, max_size=20), probability, st.floats(0, 1))
def test_returns_equal_the_eq14_closed_form(
    outcomes: list[float], reward: float, gamma: float
) -> None:
    r = ordinal_projection(outcomes)
    T = len(r)
    returns = trajectory_returns(outcomes, reward, gamma=gamma)
    for t in range(T):
        closed = sum(gamma ** (j - t) * r[j] for j in range(t, T)) + gamma ** (T - t) * reward
        assert returns[t] == pytest.approx(closed, abs=1e-9)


@pytest.mark.parametrize(
    ("outcomes", "reward", "kwargs", "name"),
    [
        ([], 0.5, {}, "turn_outcomes"),
        ([0.5, 1.2], 0.5, {}, "turn_outcomes"),
        ([0.5], math.nan, {}, "session_reward"),
        ([0.5], 1.5, {}, "session_reward"),
        ([0.5], 0.5, {"gamma": 1.1}, "gamma"),
        ([0.5], 0.5, {"scale": -0.5}, "scale"),
    ],
)
def test_returns_refuse_bad_input(
    outcomes: list[float], reward: float, kwargs: dict[str, float], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        trajectory_returns(outcomes, reward, **kwargs)


def test_the_first_session_keeps_its_raw_reward() -> None:
    assert projected_session_reward([0.62]) == 0.62


def test_later_sessions_use_the_latest_projected_value() -> None:
    history = [0.6, 0.7, 0.65]
    assert projected_session_reward(history) == ordinal_projection(history)[-1]
    assert projected_session_reward([0.6, 0.6]) == 0.6
    with pytest.raises(ValueError, match="history"):
        projected_session_reward([])
