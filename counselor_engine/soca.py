"""State-conditioned Ordinal Credit Assignment (paper, Sec. 2.4, Eq. 7-9, 12, App. C.1).

Two resolutions of evidence: within a turn, two-order pairwise judgments become an acyclic
preference graph over the N candidates (Eq. 7), whose depth picks the delivered reply and
whose edges feed LiPO; after the session, realized turn outcomes are replaced by their
ordinal projection (Eq. 8) and propagated backwards as returns for HBSP (Eq. 9).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from counselor_engine import _validate

FLOOR = 0.1  # the configured stability floor (App. C.1)
SCALE = 0.5  # s in Eq. 8
GAMMA = 0.9  # discount in Eq. 9
_XI_TOLERANCE = 1e-16  # bisection bracket width for the Eq. 8 shift

Scores = Sequence[float] | np.ndarray


VOTES = ("binary", "soft")  # how a criterion's A/B probabilities enter Eq. 12
DEFAULT_VOTES = "binary"


def criterion_vote(p_i: float, p_j: float) -> float | None:
    """The binary z of Eq. 12 for one criterion in one order: 1.0 when the judge gives
    the original candidate i the higher probability, 0.0 when it gives j the higher one,
    None (no vote) on an exact tie."""
    p_i, p_j = _validate.finite("p_i", p_i), _validate.finite("p_j", p_j)
    if p_i > p_j:
        return 1.0
    if p_i < p_j:
        return 0.0
    return None


def vote_share(votes: Sequence[float | None], weights: Sequence[float]) -> float:
    """Eq. 12 on binary votes: the weighted share of the voting criteria that favour i.

    Choice (paper silent: Eq. 12 is stated for a complete binary vector): a criterion
    whose two probabilities tie exactly casts no vote, so its weight leaves both the
    numerator and the denominator; the share then reads "of the criteria that took a
    side, how much weight took i's". A tie therefore never counts for either candidate,
    and the shares of i and j still sum to 1. When no criterion votes the share is 0.5,
    which Eq. 7 turns into no edge.
    """
    w = _validate.vector("weights", weights)
    if len(votes) != w.size or w.size == 0:
        raise ValueError(f"weights: length {w.size} does not match votes ({len(votes)})")
    if (w <= 0.0).any():
        raise ValueError("weights: every weight must be > 0")
    cast = [(float(wl), v) for wl, v in zip(w, votes, strict=True) if v is not None]
    if any(v not in (0.0, 1.0) for _, v in cast):
        raise ValueError("votes: each vote must be 1.0, 0.0 or None")
    if not cast:
        return 0.5
    total = sum(wl for wl, _ in cast)
    return float(np.clip(sum(wl * v for wl, v in cast) / total, 0.0, 1.0))


def support_share(judgments: Sequence[float], weights: Sequence[float]) -> float:
    """Eq. 12 as a weighted mean of z over all criteria.

    With binary ``judgments`` this is the paper's Eq. 12 for a complete vote vector.
    With soft values in [0, 1] (a judge's probability that criterion l favours i) it is
    the "soft" variant: for independent criteria, the expectation of Eq. 12, since the
    share is linear in each z. It is NOT the default (see :func:`vote_share`): averaging
    probabilities pulls p toward 0.5 whenever the judge is unsure on every criterion, so
    c_ij of Eq. 7 shrinks, fewer edges clear the floor and every LiPO weight changes.
    """
    z = _validate.unit_vector("judgments", judgments)
    w = _validate.vector("weights", weights)
    if w.shape != z.shape:
        raise ValueError(f"weights: length {w.size} does not match judgments ({z.size})")
    if (w <= 0.0).any():
        raise ValueError("weights: every weight must be > 0")
    return float(np.clip(np.dot(w, z) / w.sum(), 0.0, 1.0))  # clip: rounding only


@dataclass(frozen=True)
class Edge:
    """A supported preference ``winner`` > ``loser`` with SOCA strength ``weight`` (Eq. 7)."""

    winner: int
    loser: int
    weight: float


def edge_strength(p_forward: float, p_backward: float) -> tuple[bool, float] | None:
    """Eq. 7 for one pair: ``(i_wins, c_ij)``, or None when the two orders disagree.

    Both supports must lie strictly on the same side of 0.5; a tie at 0.5 abstains.
    """
    return _strength(
        _validate.unit("p_forward", p_forward), _validate.unit("p_backward", p_backward)
    )


def _strength(p_f: float, p_b: float) -> tuple[bool, float] | None:
    """Eq. 7 on checked supports."""
    if p_f > 0.5 and p_b > 0.5:
        return True, 2.0 * min(p_f, p_b) - 1.0
    if p_f < 0.5 and p_b < 0.5:
        return False, 2.0 * min(1.0 - p_f, 1.0 - p_b) - 1.0
    return None


def _tie_key(group_id: str, i: int, j: int) -> bytes:
    """Deterministic order among equal strengths (never ``hash()``: it is salted)."""
    return hashlib.sha256(f"{group_id}:{i}:{j}".encode()).digest()


def build_preference_graph(
    n: int,
    support: Mapping[tuple[int, int], tuple[float, float]],
    *,
    floor: float = FLOOR,
    group_id: str = "",
) -> list[Edge]:
    """The acyclic SOCA preference graph over ``n`` candidates (Eq. 7).

    ``support[(i, j)]`` (i < j) is ``(p_forward, p_backward)``: candidate i's support share
    (Eq. 12) in each presentation order, already mapped back to the original identities.
    Every unordered pair must be present (App. C.1).

    1. Per pair, keep a direction only when both orders agree strictly (Eq. 7); strength
       c = 2 min(...) - 1.
    2. Discard edges with c < ``floor`` (an edge exactly at the floor is kept).
    3. Sort by decreasing c; equal strengths by sha256 of ``f"{group_id}:{i}:{j}"``.
    4. Admit edges in that order, skipping any whose loser already reaches its winner
       (it would close a directed cycle). Returns the admitted edges in admission order.
    """
    n = _validate.integer("n", n, minimum=1)
    floor = _validate.nonnegative("floor", floor)
    if not isinstance(group_id, str):
        raise ValueError("group_id: expected a string")
    scored: list[tuple[float, int, int, int, int]] = []  # (-c, i, j, winner, loser)
    for i, j in _all_pairs(n, support):
        verdict = _strength(*_pair_support(support, i, j))
        if verdict is not None and verdict[1] >= floor:
            winner, loser = (i, j) if verdict[0] else (j, i)
            scored.append((-verdict[1], i, j, winner, loser))
    reach = [1 << v for v in range(n)]  # reach[v]: bitset of nodes reachable from v
    edges: list[Edge] = []
    for neg_strength, _, _, winner, loser in _admission_order(scored, group_id):
        if reach[loser] >> winner & 1:
            continue  # loser already reaches winner: this edge would close a cycle
        edges.append(Edge(winner, loser, -neg_strength))
        # Everything that reached the winner now also reaches all the loser reaches.
        bit, gained = 1 << winner, reach[loser]
        reach = [r | gained if r & bit else r for r in reach]
    return edges


def _admission_order(
    scored: list[tuple[float, int, int, int, int]], group_id: str
) -> list[tuple[float, int, int, int, int]]:
    """Decreasing strength; a run of equal strengths by the sha256 tie key (hashed only
    when there is a tie to break)."""
    scored = sorted(scored, key=lambda e: e[0])
    ordered: list[tuple[float, int, int, int, int]] = []
    for _, group in itertools.groupby(scored, key=lambda e: e[0]):
        run = list(group)
        if len(run) > 1:
            run.sort(key=lambda e: _tie_key(group_id, e[1], e[2]))
        ordered += run
    return ordered


def _all_pairs(
    n: int, support: Mapping[tuple[int, int], tuple[float, float]]
) -> list[tuple[int, int]]:
    if not isinstance(support, Mapping):
        raise ValueError("support: expected a mapping (i, j) -> (p_forward, p_backward)")
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    extra = set(support) - set(pairs)
    if extra:
        shown = sorted(extra, key=repr)[:3]
        raise ValueError(f"support: keys must be pairs (i, j) with 0 <= i < j < n; got {shown}")
    missing = [p for p in pairs if p not in support]
    if missing:
        raise ValueError(f"support: missing pairs {missing[:3]} (every pair needs both orders)")
    return pairs


def _pair_support(
    support: Mapping[tuple[int, int], tuple[float, float]], i: int, j: int
) -> tuple[float, float]:
    value = support[(i, j)]
    try:
        p_f, p_b = value
    except (TypeError, ValueError):
        raise ValueError(f"support: value for {(i, j)} must be (p_forward, p_backward)") from None
    if type(p_f) is float and type(p_b) is float and 0.0 <= p_f <= 1.0 and 0.0 <= p_b <= 1.0:
        return p_f, p_b  # the common case, checked without building messages (NaN fails)
    return (
        _validate.unit(f"support[{(i, j)}].p_forward", p_f),
        _validate.unit(f"support[{(i, j)}].p_backward", p_b),
    )


def graph_depths(n: int, edges: Sequence[Edge]) -> list[int]:
    """Longest directed path from each candidate to a sink (sinks have depth 0)."""
    n = _validate.integer("n", n, minimum=1)
    children: list[list[int]] = [[] for _ in range(n)]
    for edge in _checked_edges(n, edges):
        children[edge.winner].append(edge.loser)
    depth: list[int | None] = [None] * n
    for root in range(n):
        _fill_depth(root, children, depth)
    return [d if d is not None else 0 for d in depth]


def _fill_depth(root: int, children: list[list[int]], depth: list[int | None]) -> None:
    """Iterative post-order DFS; a back edge to a node on the stack means a cycle."""
    if depth[root] is not None:
        return
    on_stack = {root}
    stack: list[tuple[int, int]] = [(root, 0)]
    while stack:
        node, k = stack[-1]
        if k < len(children[node]):
            stack[-1] = (node, k + 1)
            child = children[node][k]
            if child in on_stack:
                raise ValueError("edges: the graph has a directed cycle")
            if depth[child] is None:
                on_stack.add(child)
                stack.append((child, 0))
            continue
        stack.pop()
        on_stack.discard(node)
        depth[node] = max((depth[c] or 0) + 1 for c in children[node]) if children[node] else 0


def _checked_edges(n: int, edges: Sequence[Edge]) -> Sequence[Edge]:
    for edge in edges:
        if not isinstance(edge, Edge):
            raise ValueError(f"edges: expected Edge objects, got {type(edge).__name__}")
        for name in ("winner", "loser"):
            index = _validate.integer(f"edges.{name}", getattr(edge, name), minimum=0)
            if index >= n:
                raise ValueError(f"edges: candidate index {index} out of range for n={n}")
        if edge.winner == edge.loser:
            raise ValueError(f"edges: self-loop on candidate {edge.winner}")
    return edges


def select_delivered(
    n: int,
    edges: Sequence[Edge],
    pointwise: Sequence[float],
    *,
    admitted: Sequence[bool] | None = None,
) -> int:
    """The delivered candidate: greatest depth, then higher pointwise score, then lower index.

    Pointwise scores never create or reverse edges; an empty graph (all depths 0) is
    therefore plain pointwise selection. ``admitted`` (the output guard's verdicts):
    only those candidates may be chosen, and depth is measured on the graph among them
    (an edge to a rejected candidate lends no depth); at least one must be admitted.
    """
    allowed = [True] * n if admitted is None else [bool(a) for a in admitted]
    if len(allowed) != n or not any(allowed):
        raise ValueError("admitted: expected n flags with at least one True")
    kept = [e for e in _checked_edges(n, edges) if allowed[e.winner] and allowed[e.loser]]
    depths = graph_depths(n, kept)
    scores = _validate.vector("pointwise", pointwise)
    if scores.size != len(depths):
        raise ValueError(f"pointwise: expected {len(depths)} scores, got {scores.size}")
    return max((k for k in range(n) if allowed[k]), key=lambda k: (depths[k], scores[k], -k))


# --- Table 3 no-SOCA ablation (CounselorConfig.use_soca = False) ---------------------------
def _raw_support(support: Mapping[tuple[int, int], tuple[float, float]], i: int, j: int) -> float:
    """The raw single-order score: i's support share (Eq. 12) in the forward order only.

    Choice (paper: "raw-score preferences replace consistency-checked candidate
    preferences", App. C Table 9): the no-SOCA variant reads each pair once, as a judge
    without SOCA would, so the second presentation order is ignored rather than averaged
    in (averaging is itself a position-bias correction, i.e. part of what is ablated).
    The forward order (lower index shown as A) is the one read. The judge still asks both
    orders, so the stored evidence has the same shape in every variant.
    """
    forward, _backward = support[(i, j)]
    return float(forward)


def raw_preference_edges(
    n: int, support: Mapping[tuple[int, int], tuple[float, float]]
) -> list[Edge]:
    """No-SOCA ablation: a preference for every pair whose single-order raw score leans
    either way, weight |2 p - 1|; no second order, no floor, no cycle removal."""
    edges = []
    for i, j in sorted(support):
        p = _raw_support(support, i, j)
        if p != 0.5 and i < n and j < n:
            winner, loser = (i, j) if p > 0.5 else (j, i)
            edges.append(Edge(winner, loser, abs(2.0 * p - 1.0)))
    return edges


def raw_delivered(
    n: int,
    support: Mapping[tuple[int, int], tuple[float, float]],
    pointwise: Sequence[float],
    *,
    admitted: Sequence[bool] | None = None,
) -> int:
    """No-SOCA delivery: highest total single-order raw support against the others, then
    pointwise score, then lower index; among the ``admitted`` candidates (default all),
    counting support between admitted candidates only."""
    allowed = list(admitted) if admitted is not None else [True] * n
    share = [0.0] * n
    for i, j in support:
        if not (allowed[i] and allowed[j]):
            continue
        p = _raw_support(support, i, j)
        share[i] += p
        share[j] += 1.0 - p
    return max((k for k in range(n) if allowed[k]), key=lambda k: (share[k], pointwise[k], -k))


def midranks(scores: Scores) -> list[float]:
    """Zero-based tie-aware ranks: tied values share the mean of their zero-based ranks."""
    values = _validate.vector("scores", scores)
    order = np.argsort(values, kind="stable")
    ranks = [0.0] * values.size
    start = 0
    while start < values.size:
        end = start
        while end + 1 < values.size and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[int(order[k])] = (start + end) / 2.0
        start = end + 1
    return ranks


def ordinal_levels(scores: Scores) -> list[float]:
    """The ordinal levels l_t of Eq. 8, in [-1, 1].

    K = min(3, T) and l_t = 2 min(K - 1, floor(K rho_t / T)) / (K - 1) - 1 with zero-based
    midranks rho_t; T = 1 gives l = 0. A midrank is (a + b) / 2 for integer ranks a, b, so
    the floor is computed exactly in integers as K (a + b) // (2T). Depends on the scores
    only through their order (Proposition 1).
    """
    ranks = midranks(scores)
    count = len(ranks)
    if count == 1:
        return [0.0]
    k = min(3, count)
    levels = []
    for rho in ranks:
        twice_rho = round(2 * rho)  # exact: rho is a whole or half integer
        tier = min(k - 1, (k * twice_rho) // (2 * count))
        levels.append(2.0 * tier / (k - 1) - 1.0)
    return levels


def ordinal_projection(scores: Scores, *, scale: float = SCALE) -> list[float]:
    """Eq. 8: r~_t = clip(R_bar + s l_t + xi, 0, 1) with mean(r~) = R_bar.

    1. Check every score is in [0, 1]; R_bar is their mean.
    2. Levels l_t from tie-aware midranks (:func:`ordinal_levels`).
    3. Find the common shift xi by bisection: mean(clip(R_bar + s l + xi, 0, 1)) is
       continuous and non-decreasing in xi, 0 at xi = -(1 + s) and 1 at xi = 1 + s, so a
       root exists for any R_bar in [0, 1]. The bracket is halved down to 1e-16 or to
       adjacent floats (about 55 steps); the mean's slope in xi is at most 1, so the mean
       is kept to ~1e-15.

    Equal scores get equal credit. When all scores are equal (including T = 1) there is no
    ordinal information (paper, H.7) and the scores are returned unchanged.
    """
    values = _validate.unit_vector("scores", scores)
    scale = _validate.nonnegative("scale", scale)
    if values.min() == values.max():
        return [float(v) for v in values]
    levels = np.array(ordinal_levels(values), dtype=np.float64)
    target = float(values.mean())
    base = target + scale * levels
    return [float(v) for v in _mean_preserving_clip(base, target, scale)]


def _mean_preserving_clip(base: np.ndarray, target: float, scale: float) -> np.ndarray:
    """clip(base + xi, 0, 1) with xi chosen by bisection so that its mean is ``target``."""
    lo, hi = -1.0 - scale, 1.0 + scale
    while hi - lo > _XI_TOLERANCE:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break  # adjacent floats: the bracket cannot shrink further
        if np.clip(base + mid, 0.0, 1.0).mean() < target:
            lo = mid
        else:
            hi = mid
    below = np.clip(base + lo, 0.0, 1.0)
    above = np.clip(base + hi, 0.0, 1.0)
    closer = abs(below.mean() - target) <= abs(above.mean() - target)
    return below if closer else above


def trajectory_returns(
    turn_outcomes: Scores,
    session_reward: float,
    *,
    scale: float = SCALE,
    gamma: float = GAMMA,
) -> list[float]:
    """Eq. 9 on the projected outcomes: G_t = r~_t + gamma G_{t+1}, G_{T+1} = session reward.

    Returns G_1..G_T (one per realized turn), equal to the closed form of Eq. 14. The
    session reward must lie in [0, 1] like the outcomes (pass
    :func:`projected_session_reward` for the paper's r_session).
    """
    _validate.unit_vector("turn_outcomes", turn_outcomes)
    projected = ordinal_projection(turn_outcomes, scale=scale)
    G = _validate.unit("session_reward", session_reward)
    gamma = _validate.unit("gamma", gamma)
    return _discounted_returns(projected, G, gamma)


def _discounted_returns(rewards: Sequence[float], terminal: float, gamma: float) -> list[float]:
    """The recursion of Eq. 9: G_t = r_t + gamma G_{t+1}, G_{T+1} = ``terminal``."""
    G = float(terminal)
    returns = [0.0] * len(rewards)
    for t in range(len(rewards) - 1, -1, -1):
        G = float(rewards[t]) + gamma * G
        returns[t] = G
    return returns


def unprojected_returns(outcomes: Sequence[float], reward: float, *, gamma: float) -> list[float]:
    """No-SOCA credit: Eq. 9 on the raw outcomes, G_{T+1} = the raw session reward (no
    ordinal projection, Eq. 8)."""
    return _discounted_returns(outcomes, reward, gamma)


def projected_session_reward(history: Scores, *, scale: float = SCALE) -> float:
    """r_session for the latest session (App. C).

    ``history`` is the client's raw session rewards, oldest first, ending with the session
    just finished. The first session keeps its raw value; afterwards the value is the last
    entry of the ordinal projection (Eq. 8) of the whole history.
    """
    values = _validate.unit_vector("history", history)
    if values.size == 1:
        return float(values[0])
    return ordinal_projection(values, scale=scale)[-1]


# --- Which sessions may move the posterior (paper, H.7) ------------------------------------

SKIP_JUDGE_FAILED = "judge_failed"
SKIP_TOO_FEW_JUDGED = "too_few_judged_turns"
SKIP_ALL_TIED = "all_tied"
SKIP_RULES = (SKIP_JUDGE_FAILED, SKIP_TOO_FEW_JUDGED, SKIP_ALL_TIED)
MIN_JUDGED_TURNS = 2


@dataclass(frozen=True)
class EvidenceCheck:
    """The record a session keeps of whether its outcomes may reach Eq. 4.

    ``judged``: turns with a judged outcome R_t; ``variance``: the population variance of
    those outcomes (None when there are none); ``skip``: the rule that fired, or "" when
    the evidence is sound.
    """

    judged: int
    variance: float | None
    skip: str = ""

    @property
    def sound(self) -> bool:
        return not self.skip

    def to_dict(self) -> dict[str, object]:
        return {"judged": self.judged, "variance": self.variance, "skip": self.skip}


def check_session_evidence(
    outcomes: Sequence[float | None], *, judge_failed: bool = False
) -> EvidenceCheck:
    """Decide whether a session's turn outcomes may update any posterior cell.

    ``outcomes`` holds one entry per realized turn: the judged R_t, or None where no
    outcome was judged (the last turn has no client reaction; a safety turn made no skill
    decision). Imputed values must never be passed in: they are exactly what H.7 warns
    about (an archived run with 725 rewards equal to 0.5 updated posteriors from nothing).

    Rules, first match wins (choices where the paper is silent, beyond H.7's "record the
    variance and skip" for a fully tied group):
    1. ``judge_failed``: the judge raised or timed out for the session, so no outcome is
       trustworthy, whatever was read before the failure.
    2. ``too_few_judged_turns``: fewer than 2 judged outcomes. Eq. 8 needs T > 1 for any
       ordinal level (T = 1 gives l = 0), so one outcome carries no order to project.
    3. ``all_tied``: every judged outcome is exactly equal: no recoverable strict order
       (H.7). Ties are exact float equality, like Eq. 8's midranks; outcomes that differ
       by any amount are ordered (Proposition 1: Eq. 8 sees only their order), so
       near-ties are sound and get the full ordinal spread.
    The variance is recorded in every case, so a reviewer can see how compressed the
    scores were.
    """
    judged = [_validate.unit("outcomes", v) for v in outcomes if v is not None]
    variance = float(np.var(judged)) if judged else None
    if judge_failed:
        return EvidenceCheck(len(judged), variance, SKIP_JUDGE_FAILED)
    if len(judged) < MIN_JUDGED_TURNS:
        return EvidenceCheck(len(judged), variance, SKIP_TOO_FEW_JUDGED)
    if min(judged) == max(judged):
        return EvidenceCheck(len(judged), 0.0, SKIP_ALL_TIED)  # not np.var's rounding
    return EvidenceCheck(len(judged), variance)
