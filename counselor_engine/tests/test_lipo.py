"""LiPO: the group and population losses (Eq. 5-6) and the batch sampler (App. C)."""

from __future__ import annotations

import copy
import itertools
import math
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.lipo.batch import sample_batch
from counselor_engine.lipo.loss import group_loss, pairwise_dpo_loss, population_loss
from counselor_engine.skills import MODALITIES
from counselor_engine.soca import Edge

# --- Eq. 5-6 -----------------------------------------------------------------------------


def test_one_unit_edge_is_the_dpo_loss() -> None:
    h = torch.tensor([0.3, -0.2])
    loss = group_loss(h, [Edge(0, 1, 1.0)])
    assert loss.item() == pytest.approx(-math.log(torch.sigmoid(torch.tensor(0.5)).item()))


def test_a_group_divides_by_its_edge_count_not_its_weight_sum() -> None:
    h = torch.tensor([1.0, 0.0, -0.5])
    edges = [Edge(0, 1, 0.8), Edge(1, 2, 0.2), Edge(0, 2, 0.5)]
    terms = [0.8 * F.softplus(torch.tensor(-1.0)), 0.2 * F.softplus(torch.tensor(-0.5))]
    terms.append(0.5 * F.softplus(torch.tensor(-1.5)))
    assert group_loss(h, edges).item() == pytest.approx(sum(t.item() for t in terms) / 3)


def test_the_gradient_matches_appendix_j() -> None:
    """d loss / d (h_i - h_j) = -w sigma(-d) / |E| for an accepted edge."""
    h = torch.tensor([0.4, 0.1, -0.3], requires_grad=True)
    edges = [Edge(0, 1, 0.6), Edge(2, 1, 0.3)]
    group_loss(h, edges).backward()
    g01 = -0.6 * torch.sigmoid(torch.tensor(-0.3)).item() / 2
    g21 = -0.3 * torch.sigmoid(torch.tensor(0.4)).item() / 2  # d = h2 - h1 = -0.4
    assert h.grad is not None
    assert h.grad.tolist() == pytest.approx([g01, -g01 - g21, g21])


def test_groups_are_averaged_equally() -> None:
    small = (torch.tensor([0.2, 0.0]), [Edge(0, 1, 0.5)])
    big = (torch.tensor([0.0, 0.1, 0.3, -0.2]), [Edge(0, 1, 0.4), Edge(2, 3, 0.9), Edge(2, 1, 0.2)])
    expected = (group_loss(*small) + group_loss(*big)) / 2
    assert population_loss([small, big]).item() == pytest.approx(expected.item())


def test_pairwise_dpo_is_the_unit_weight_mean_over_every_pair() -> None:
    small = (torch.tensor([0.3, -0.2]), [Edge(0, 1, 0.9)])
    big = (torch.tensor([1.0, 0.0, -0.5]), [Edge(0, 1, 0.2), Edge(0, 2, 0.4), Edge(1, 2, 0.1)])
    margins = torch.tensor([0.5, 1.0, 1.5, 0.5])
    expected = F.softplus(-margins).mean()  # four pairs, each weight 1, no group means
    assert pairwise_dpo_loss([small, big]).item() == pytest.approx(expected.item())
    lipo = population_loss([small, big]).item()
    assert pairwise_dpo_loss([small, big]).item() != pytest.approx(lipo)
    # One unit-weight edge: Eq. 5 reduces to the standard pairwise DPO loss (Sec. 2.3).
    one = (torch.tensor([0.7, 0.1]), [Edge(1, 0, 1.0)])
    assert pairwise_dpo_loss([one]).item() == pytest.approx(population_loss([one]).item())
    with pytest.raises(ValueError, match="groups"):
        pairwise_dpo_loss([])


def test_the_population_loss_is_differentiable() -> None:
    h1 = torch.tensor([0.1, 0.2], requires_grad=True)
    h2 = torch.tensor([0.0, 0.5, -0.1], requires_grad=True)
    population_loss([(h1, [Edge(1, 0, 0.3)]), (h2, [Edge(0, 2, 0.7)])]).backward()
    assert h1.grad is not None and h2.grad is not None
    assert h1.grad[1] < 0 < h1.grad[0]


@pytest.mark.parametrize(
    ("h", "edges", "message"),
    [
        (torch.tensor([0.1, 0.2]), [], "edges: empty group"),
        (torch.tensor([0.1, 0.2]), [Edge(0, 2, 0.5)], "out of range"),
        (torch.tensor([0.1, 0.2]), [Edge(1, 1, 0.5)], "self-loop"),
        (torch.tensor([0.1, 0.2]), [Edge(0, 1, 0.0)], "edges.weight"),
        (torch.tensor([0.1, 0.2]), [Edge(0, 1, math.nan)], "edges.weight"),
        (torch.tensor([0.1, math.nan]), [Edge(0, 1, 0.5)], "h: contains NaN"),
        (torch.tensor([[0.1, 0.2]]), [Edge(0, 1, 0.5)], "h"),
        (torch.tensor([1, 2]), [Edge(0, 1, 0.5)], "h"),
    ],
)
def test_group_loss_refuses_bad_input(h: torch.Tensor, edges: list[Edge], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group_loss(h, edges)


def test_population_loss_refuses_no_groups() -> None:
    with pytest.raises(ValueError, match="groups"):
        population_loss([])


# --- sample_batch -------------------------------------------------------------------------


@dataclass
class Graph:
    modality: str
    edges: list[int] = field(default_factory=list)
    name: str = ""


def _g(modality: str, size: int, name: str = "") -> Graph:
    return Graph(modality, list(range(size)), name)


def _edges_by_modality(batch: list[Graph]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for graph in batch:
        counts[graph.modality] += len(graph.edges)
    return counts


def test_it_fills_each_modality_with_exactly_64_edges() -> None:
    pool = [_g(m, 8) for m in MODALITIES for _ in range(10)]
    batch = sample_batch(pool)
    assert batch is not None and len(batch) == 40
    assert _edges_by_modality(batch) == dict.fromkeys(MODALITIES, 64)


def test_it_returns_none_and_touches_nothing_when_no_batch_exists() -> None:
    pool = [_g(m, 8) for m in MODALITIES for _ in range(10)]
    pool[-3:] = [_g("pmt", 7) for _ in range(3)]  # 7 x 8 + 3 x 7: no subset sums to 64
    before = copy.deepcopy(pool)
    assert sample_batch(pool) is None
    assert pool == before


def test_it_needs_enough_groups() -> None:
    pool = [_g(m, 16) for m in MODALITIES for _ in range(4)]  # 20 graphs in total
    assert sample_batch(pool) is None
    assert sample_batch(pool, min_groups=20) is not None


def test_min_groups_can_force_many_small_graphs() -> None:
    pool = [_g(m, 64, "big") for m in MODALITIES]
    pool += [_g(m, 8, "small") for m in MODALITIES for _ in range(8)]
    assert {g.name for g in sample_batch(pool, min_groups=5) or []} == {"big"}
    batch = sample_batch(pool, min_groups=36)  # at most one modality may use its big graph
    assert batch is not None and len(batch) >= 36
    assert Counter(g.name for g in batch)["big"] <= 1
    assert sample_batch(pool, min_groups=41) is None


def test_it_prefers_older_graphs_and_keeps_input_order() -> None:
    pool = [_g(m, 8, f"{m}-{k}") for k in range(20) for m in MODALITIES]
    batch = sample_batch(pool)
    assert batch is not None
    assert [g.name for g in batch] == [g.name for g in pool[:40]]


def test_it_never_uses_empty_graphs_or_unlisted_modalities() -> None:
    pool = [_g("cbt", 0), _g("dbt", 8)] + [_g(m, 8) for m in MODALITIES for _ in range(8)]
    batch = sample_batch(pool)
    assert batch is not None
    assert all(g.edges and g.modality in MODALITIES for g in batch)


def test_it_is_deterministic() -> None:
    rng = random.Random(5)
    pool = [_g(rng.choice(MODALITIES), rng.randint(0, 10)) for _ in range(400)]
    first = sample_batch(pool)
    assert first is not None and first == sample_batch(list(pool))


def test_it_honours_other_configurations() -> None:
    pool = [_g("cbt", 4) for _ in range(10)] + [_g("bt", 2) for _ in range(10)]
    batch = sample_batch(pool, edges=20, min_groups=6, modalities=("cbt", "bt"), min_share=0.3)
    assert batch is not None and sum(len(g.edges) for g in batch) == 20
    counts = _edges_by_modality(batch)
    assert counts["cbt"] >= 6 and counts["bt"] >= 6 and len(batch) >= 6


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"edges": 0}, "edges"),
        ({"min_groups": -1}, "min_groups"),
        ({"min_share": math.nan}, "min_share"),
        ({"min_share": 0.3}, "min_share"),  # 5 x 96 > 320: can never be met
        ({"modalities": ()}, "modalities"),
        ({"modalities": ("cbt", "cbt")}, "modalities"),
    ],
)
def test_sample_batch_refuses_bad_configuration(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        sample_batch([_g("cbt", 3)], **kwargs)  # type: ignore[arg-type]


def test_sample_batch_refuses_items_that_are_not_graphs() -> None:
    with pytest.raises(ValueError, match="graphs"):
        sample_batch([object()])  # type: ignore[type-var]


# --- Properties against an independent reference ------------------------------------------

SMALL = {"edges": 20, "min_share": 0.2}  # 5 modalities x exactly 4 edges


def _reachable(sizes: list[int], limit: int) -> set[tuple[int, int]]:
    """Every (edge sum <= limit, group count) some subset of ``sizes`` reaches."""
    states = {(0, 0)}
    for size in sizes:
        states |= {(s + size, c + 1) for s, c in states if s + size <= limit}
    return states


def _batch_exists(pool: list[Graph], edges: int, min_share: float, min_groups: int) -> bool:
    quota = math.ceil(min_share * edges - 1e-9)
    totals = {(0, 0)}
    for m in MODALITIES:
        sizes = [len(g.edges) for g in pool if g.modality == m and g.edges]
        options = {(s, c) for s, c in _reachable(sizes, edges) if s >= quota}
        totals = {(s + s2, c + c2) for s, c in totals for s2, c2 in options if s + s2 <= edges}
    return any(s == edges and c >= min_groups for s, c in totals)


def _composition(draw: st.DrawFn, total: int) -> list[int]:
    parts: list[int] = []
    while sum(parts) < total:
        parts.append(draw(st.integers(1, total - sum(parts))))
    return parts


@st.composite
def pools(draw: st.DrawFn) -> list[Graph]:
    """Small shuffled pools; about a third of them admissible for SMALL."""
    pool: list[Graph] = []
    for m in [*MODALITIES, "dbt"]:
        if draw(st.integers(0, 9)) < 8:
            pool += [_g(m, size) for size in _composition(draw, 4)]
        pool += [_g(m, size) for size in draw(st.lists(st.integers(0, 5), max_size=4))]
    return [pool[k] for k in draw(st.permutations(range(len(pool))))]


@settings(max_examples=120, deadline=None)
@given(pools(), st.integers(0, 14))
def test_sample_batch_postconditions(pool: list[Graph], min_groups: int) -> None:
    before = copy.deepcopy(pool)
    batch = sample_batch(pool, min_groups=min_groups, **SMALL)  # type: ignore[arg-type]
    assert pool == before
    assert (batch is not None) == _batch_exists(pool, 20, 0.2, min_groups)
    if batch is None:
        return
    positions = [next(k for k, g in enumerate(pool) if g is b) for b in batch]
    assert positions == sorted(set(positions))  # whole graphs, each once, in input order
    assert sum(len(g.edges) for g in batch) == 20 and len(batch) >= min_groups
    assert _edges_by_modality(batch) == dict.fromkeys(MODALITIES, 4)
    assert all(g.edges and g.modality in MODALITIES for g in batch)


def _count_admissible(pool: list[Graph], quota: int, min_groups: int) -> int:
    """How many distinct admissible batches ``pool`` holds (by brute force per modality)."""
    per_count: list[Counter[int]] = []
    for m in MODALITIES:
        sizes = [len(g.edges) for g in pool if g.modality == m and g.edges]
        counts: Counter[int] = Counter()
        for r in range(len(sizes) + 1):
            for subset in itertools.combinations(sizes, r):
                if sum(subset) == quota:
                    counts[r] += 1
        per_count.append(counts)
    total = 0
    for combo in itertools.product(*(c.items() for c in per_count)):
        if sum(k for k, _ in combo) >= min_groups:
            total += math.prod(n for _, n in combo)
    return total


@st.composite
def unique_pools(draw: st.DrawFn) -> tuple[list[Graph], int]:
    """A shuffled pool with exactly one admissible batch (the planted graphs) for SMALL.

    Decoys are kept only if the pool still holds one admissible batch, counted by brute
    force; with ``min_groups`` at the planted count, decoys may form alternative edge sums
    that fall short on groups.
    """
    pool = [_g(m, size, "planted") for m in MODALITIES for size in _composition(draw, 4)]
    min_groups = len(pool)
    for m in MODALITIES:
        for size in draw(st.lists(st.integers(1, 4), max_size=6)):
            trial = [*pool, _g(m, size, "decoy")]
            if _count_admissible(trial, 4, min_groups) == 1:
                pool = trial
    order = draw(st.permutations(range(len(pool))))
    return [pool[k] for k in order], min_groups


@settings(max_examples=80, deadline=None)
@given(unique_pools())
def test_it_finds_the_only_batch(case: tuple[list[Graph], int]) -> None:
    pool, min_groups = case
    assert _count_admissible(pool, 4, min_groups) == 1
    batch = sample_batch(pool, min_groups=min_groups, **SMALL)  # type: ignore[arg-type]
    assert batch is not None
    assert sorted(id(g) for g in batch) == sorted(id(g) for g in pool if g.name == "planted")


@st.composite
def tight_pools(draw: st.DrawFn) -> tuple[list[Graph], int]:
    """Several subsets reach 64 edges per modality, but only one has enough groups."""
    pool: list[Graph] = []
    for m in MODALITIES:
        pool += [_g(m, 1, "planted") for _ in range(8)]
        pool += [_g(m, 8, "planted") for _ in range(7)]
        pool += [_g(m, 64, "decoy"), _g(m, 32, "decoy"), _g(m, 16, "decoy")]
    order = draw(st.permutations(range(len(pool))))
    return [pool[k] for k in order], 5 * 15


@settings(max_examples=20, deadline=None)
@given(tight_pools())
def test_it_finds_the_only_batch_with_enough_groups(case: tuple[list[Graph], int]) -> None:
    pool, min_groups = case
    batch = sample_batch(pool, min_groups=min_groups)
    assert batch is not None and len(batch) == min_groups
    assert all(g.name == "planted" for g in batch)


# --- the web side samples batches without torch ----------------------------------------------


def test_it_samples_batches_without_loading_torch() -> None:
    """The web side imports the sampler (webapp.learning) and the config (settings) in
    every process; torch there would cost seconds and hundreds of megabytes."""
    code = (
        "import sys\n"
        "import counselor_engine.lipo.batch, counselor_engine.lipo.config\n"
        "assert 'torch' not in sys.modules, 'the LiPO sampler or config imported torch'\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# --- LipoConfig: every LiPO default once, checked ---------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", 0),
        ("steps", 2.5),
        ("steps", True),
        ("max_length", 8),
        ("beta", -0.1),
        ("learning_rate", float("nan")),
        ("min_share", "0.2"),
        ("loss", "hinge"),
        ("queue", ""),
        ("modalities", "cbt"),
        ("modalities", ("cbt", "dbt")),
        ("modalities", ()),
    ],
)
def test_lipo_config_refuses_a_bad_value_naming_the_field(field: str, value: object) -> None:
    from counselor_engine.lipo.config import LipoConfig

    with pytest.raises(ValueError, match=rf"^{field}: "):
        LipoConfig(**{field: value})  # type: ignore[arg-type]


def test_lipo_config_keeps_a_list_as_a_tuple_and_records_itself_as_json() -> None:
    import json

    from counselor_engine.lipo.config import LipoConfig

    config = LipoConfig(modalities=["cbt", "bt"])  # type: ignore[arg-type]
    assert config.modalities == ("cbt", "bt")
    assert config.lora_alpha == 2 * config.lora_rank
    assert json.loads(json.dumps(config.to_dict()))["modalities"] == ["cbt", "bt"]
