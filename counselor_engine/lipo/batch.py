"""The LiPO batch sampler: whole graphs from the population buffer so that a round gets
exactly the configured number of preference edges with every modality represented (App. C,
"Population weighting and batch units").

numpy only, never torch: the web side samples batches (webapp.learning.schedule) and must
not load torch for it (test_lipo_batch_imports_no_torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np

from counselor_engine import _validate
from counselor_engine.skills import MODALITIES

_UNREACHABLE = -(10**9)  # "no subset reaches this edge sum" in the max-count tables


class GraphLike(Protocol):
    """Anything stored in the evidence buffer: a modality and its retained edges."""

    @property
    def modality(self) -> str: ...

    @property
    def edges(self) -> Sequence[object]: ...


G = TypeVar("G", bound=GraphLike)


def sample_batch(
    graphs: Sequence[G],
    *,
    edges: int = 320,
    min_groups: int = 32,
    modalities: Sequence[str] = MODALITIES,
    min_share: float = 0.2,
) -> list[G] | None:
    """Whole graphs for one LiPO round, or None (touching nothing) when none is admissible.

    Admissible: exactly ``edges`` edges in total, at least ``min_groups`` graphs, and each
    listed modality holding at least q = ceil(min_share * edges) edges. With the defaults
    that forces exactly 64 edges per modality. Graphs with no edges are never used (they
    carry no preference); graphs of unlisted modalities are ignored.

    1. Per modality, tabulate best[t] = the most graphs whose edge counts sum to exactly t
       (a bounded knapsack over the distinct edge counts, with binary splitting).
    2. Combine modalities: choose targets t_m >= q with sum t_m = ``edges`` maximising
       sum best[t_m] (a max-plus convolution). A batch exists iff that maximum is at least
       ``min_groups``, because any batch's group count is at most it: the search is exact.
    3. Share the group requirement among modalities as evenly as their capacities allow
       (water-filling in ascending capacity, then listed order): quotas k_m <= best[t_m].
    4. Per modality, pick graphs summing to t_m with at least k_m of them, preferring old
       evidence: walking from the newest graph back, skip a graph whenever the rest can
       still be met by older ones (reachability bitsets over (edge sum, group count)).
       Given t_m and k_m, no other choice has an older newest graph, then next-newest, ...

    Deterministic: the order of ``graphs`` (oldest first) is the only tie-breaker. Returns
    the selected graphs in input order.
    """
    total, quota, min_groups, listed = _check_batch_args(edges, min_groups, modalities, min_share)
    by_modality = _group_by_modality(graphs, listed)
    slack = total - quota * len(listed)
    best = {m: _max_groups_by_sum(by_modality[m], quota + slack) for m in listed}
    targets = _choose_targets(best, listed, quota, slack, min_groups)
    if targets is None:
        return None
    quotas = _share_groups(min_groups, {m: int(best[m][targets[m]]) for m in listed}, listed)
    chosen: list[int] = []
    for m in listed:
        chosen += _oldest_subset(by_modality[m], targets[m], quotas[m])
    return [graphs[i] for i in sorted(chosen)]


def _check_batch_args(
    edges: int, min_groups: int, modalities: Sequence[str], min_share: float
) -> tuple[int, int, int, list[str]]:
    total = _validate.integer("edges", edges, minimum=1)
    min_groups = _validate.integer("min_groups", min_groups, minimum=0)
    share = _validate.unit("min_share", min_share)
    if isinstance(modalities, str) or not modalities:
        raise ValueError("modalities: expected a non-empty sequence of modality names")
    listed = _validate.distinct("modalities", modalities)
    quota = max(0, math.ceil(share * total - 1e-9))
    if quota * len(listed) > total:
        raise ValueError(
            f"min_share: {len(listed)} modalities x {quota} edges exceed the batch of {total}"
        )
    return total, quota, min_groups, listed


def _group_by_modality(
    graphs: Sequence[GraphLike], listed: list[str]
) -> dict[str, list[tuple[int, int]]]:
    """(input index, edge count) per listed modality, in input order; empty graphs dropped."""
    if isinstance(graphs, str) or not isinstance(graphs, Sequence):
        raise ValueError("graphs: expected a sequence of graphs")
    by_modality: dict[str, list[tuple[int, int]]] = {m: [] for m in listed}
    for index, graph in enumerate(graphs):
        try:
            modality, size = graph.modality, len(graph.edges)
        except (AttributeError, TypeError):
            raise ValueError(f"graphs: item {index} has no .modality and sized .edges") from None
        if not isinstance(modality, str):
            raise ValueError(f"graphs: item {index} has a non-string modality")
        if size > 0 and modality in by_modality:
            by_modality[modality].append((index, size))
    return by_modality


def _max_groups_by_sum(items: list[tuple[int, int]], limit: int) -> np.ndarray:
    """best[t] for t = 0..limit: the most graphs with edge counts summing to exactly t.

    Graphs of equal size are interchangeable for this table, so it is a bounded knapsack
    over the distinct sizes; each size's multiplicity is split into pieces 1, 2, 4, ...
    (every count up to the multiplicity is a sum of distinct pieces).
    """
    best = np.full(limit + 1, _UNREACHABLE, dtype=np.int64)
    best[0] = 0
    sizes: dict[int, int] = {}
    for _, size in items:
        if size <= limit:
            sizes[size] = sizes.get(size, 0) + 1
    for size, available in sorted(sizes.items()):
        remaining = min(available, limit // size)
        piece = 1
        while remaining > 0:
            take = min(piece, remaining)
            shift = take * size
            shifted = best[:-shift] + take
            np.maximum(best[shift:], shifted, out=best[shift:])
            remaining -= take
            piece *= 2
    return best


def _choose_targets(
    best: dict[str, np.ndarray], listed: list[str], quota: int, slack: int, min_groups: int
) -> dict[str, int] | None:
    """Edge targets t_m = quota + x_m with sum x_m = slack, maximising the group count.

    A max-plus convolution over the modalities in listed order. Among splits with the
    same group count, each modality's extra stays closest to an even share of the extra
    so far (then the smaller one), so slack is spread rather than piled on one modality.
    None when the best total falls short of ``min_groups`` or no split reaches the edge
    total at all.
    """
    total = best[listed[0]][quota : quota + slack + 1].copy()
    choices: list[np.ndarray] = []
    for position, m in enumerate(listed[1:], start=2):
        gain = best[m][quota : quota + slack + 1]
        merged = np.full(slack + 1, _UNREACHABLE, dtype=np.int64)
        choice = np.zeros(slack + 1, dtype=np.int64)
        even = np.arange(slack + 1) / position  # this modality's even share of s extras
        for y in range(slack + 1):  # this modality takes y extra edges
            candidate = total[: slack + 1 - y] + gain[y]
            current = merged[y:]
            fairer = np.abs(y - even[y:]) < np.abs(choice[y:] - even[y:])
            better = (candidate > current) | ((candidate == current) & fairer)
            merged[y:][better] = candidate[better]
            choice[y:][better] = y
        total = merged
        choices.append(choice)
    if total[slack] < max(min_groups, 0):
        return None
    extras = [0] * len(listed)
    remaining = slack
    for position in range(len(listed) - 1, 0, -1):
        extras[position] = int(choices[position - 1][remaining])
        remaining -= extras[position]
    extras[0] = remaining
    return {m: quota + x for m, x in zip(listed, extras, strict=True)}


def _share_groups(need: int, capacity: dict[str, int], listed: list[str]) -> dict[str, int]:
    """Quotas k_m <= capacity_m summing to ``need``, spread as evenly as capacities allow."""
    quotas = dict.fromkeys(listed, 0)
    order = sorted(listed, key=lambda m: (capacity[m], listed.index(m)))
    left = need
    for done, m in enumerate(order):
        share = min(capacity[m], -(-left // (len(order) - done)))
        quotas[m] = max(share, 0)
        left -= quotas[m]
    return quotas


def _oldest_subset(items: list[tuple[int, int]], target: int, need: int) -> list[int]:
    """Input indices of graphs summing to ``target`` edges, at least ``need`` of them,
    avoiding newer graphs whenever older ones suffice.

    Reachable (edge sum, group count) pairs are a bitset with one row of width
    2 * target + 1 per count 0..need; the last row means "need or more" (saturating), so
    the sets stay small. Layer i holds what graphs items[:i] can reach. Scanning forward
    stops at the first prefix that can meet (target, need); walking back from there, a
    graph is taken only when the requirement cannot be met without it.
    """
    if target == 0:
        return []
    width = 2 * target + 1
    row = (1 << (target + 1)) - 1  # columns 0..target of one row
    valid = sum(row << (r * width) for r in range(need + 1))
    column = sum(1 << (r * width) for r in range(need + 1))  # column 0 of every row
    at_least = [valid & ~((1 << (k * width)) - 1) for k in range(need + 1)]
    layers = [1]  # nothing taken: sum 0, count 0

    def meets(state: int, total: int, count: int) -> bool:
        return bool(state & (column << total) & at_least[max(count, 0)])

    for _, size in items:
        state = layers[-1]
        if meets(state, target, need):
            break
        if size <= target:
            moved = state << (width + size)  # take it: one more group, ``size`` more edges
            saturated = (moved >> ((need + 1) * width)) << (need * width)
            state = (state | moved | saturated) & valid
        layers.append(state)
    else:
        if not meets(layers[-1], target, need):
            raise AssertionError("targets were checked feasible; the scan must succeed")
    picked: list[int] = []
    total, count = target, need
    for position in range(len(layers) - 1, 0, -1):
        if meets(layers[position - 1], total, count):
            continue  # older graphs alone can still do it: skip this one
        index, size = items[position - 1]
        picked.append(index)
        total, count = total - size, count - 1
    return picked
