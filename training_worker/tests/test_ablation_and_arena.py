"""The pairwise-DPO loss option (Table 3 ablation) and the arena validation check."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from counselor_engine.soca import Edge
from training_worker.arena import ArenaConfig, ArenaSpec, arena_check, compare, profiles
from training_worker.round import train_config
from training_worker.tests.test_trainer import CONFIG, groups
from training_worker.trainer import LipoTrainer, TrainConfig, dpo_pair


def test_dpo_keeps_the_strongest_edge_with_unit_weight() -> None:
    edges = [Edge(0, 1, 0.3), Edge(2, 1, 0.7), Edge(0, 2, 0.7)]
    # Equal weights: the lowest (winner, loser) wins the tie.
    assert dpo_pair(edges) == [Edge(0, 2, 1.0)]
    assert dpo_pair([Edge(1, 0, 0.2)]) == [Edge(1, 0, 1.0)]
    with pytest.raises(ValueError):
        dpo_pair([])


def test_an_unknown_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="loss"):
        TrainConfig(loss="kto")


def test_the_round_takes_its_loss_from_the_run(settings) -> None:  # type: ignore[no-untyped-def]
    assert train_config("pairwise_dpo").loss == "pairwise_dpo"
    assert train_config(None).loss == "lipo"


def test_pairwise_dpo_trains_on_one_pair_per_group(tiny_model_dir):  # type: ignore[no-untyped-def]
    """Step 0 (h = 0): LiPO gives mean_g sum_e w_e log 2 / |E|; DPO gives log 2. After a
    step, the DPO loss is exactly mean_g softplus(-(h_w - h_l)) on the strongest edge."""
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG.__class__(
        **{**CONFIG.__dict__, "loss": "pairwise_dpo"}))  # fmt: skip
    prepared = trainer.prepare(groups())
    reference = trainer.reference(prepared)
    first = trainer.step(prepared, reference)
    assert first.loss == pytest.approx(math.log(2), rel=1e-5)
    assert first.loss != pytest.approx((0.6 + 0.5) * math.log(2) / 2, rel=1e-3)  # LiPO's

    h = trainer.utilities(prepared, reference)
    expected = torch.stack([F.softplus(-(u[0] - u[1])) for u in h]).mean()  # edge 0 > 1 (0.6)
    second = trainer.step(prepared, reference)
    assert second.loss == pytest.approx(float(expected), rel=1e-4)


# -- arena ------------------------------------------------------------------------------


def test_the_arena_rule() -> None:
    active = {"c_shared": 5.0, "c_spec": 5.0, "l_shared": 5.0, "l_spec": None, "overall": 5.0}
    same = dict(active)
    assert compare(active, same, 0.5) == (True, ["c_shared", "c_spec", "l_shared", "overall"], [])
    slightly = {**active, "c_spec": 4.6}
    assert compare(active, slightly, 0.5)[0] is True
    worse = {**active, "l_shared": 4.4}
    assert compare(active, worse, 0.5) == (
        False, ["c_shared", "c_spec", "l_shared", "overall"], ["l_shared"]
    )  # fmt: skip
    nothing = dict.fromkeys(active)
    assert compare(active, nothing, 0.5) == (False, [], [])
    with pytest.raises(ValueError):
        ArenaConfig(tolerance=-1)


def test_the_arena_uses_a_fixed_spread_of_profiles() -> None:
    chosen = profiles(5)
    assert len({p.modality for p in chosen}) == 5
    assert [p.id for p in profiles(5)] == [p.id for p in chosen]


def test_a_disabled_arena_is_recorded_as_skipped() -> None:
    check = arena_check(None, ArenaConfig())
    assert check["skipped"] and check["passed"]
    assert arena_check(object(), ArenaConfig(clients=0))["skipped"]  # type: ignore[arg-type]


def test_the_arena_plays_both_versions_on_simulated_clients(tiny_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    trainer = LipoTrainer(tiny_model_dir, parent=None, config=CONFIG)
    prepared = trainer.prepare(groups(2))
    trainer.step(prepared, trainer.reference(prepared))
    candidate = trainer.save(tmp_path / "v2")
    spec = ArenaSpec(tiny_model_dir, None, None, candidate, "v2")
    config = ArenaConfig(clients=1, sessions=1, turns=2, candidates=2, max_new_tokens=8)

    check = arena_check(spec, config)

    assert check["name"] == "arena" and not check.get("skipped")
    assert check["active_version"] == "base model" and check["candidate_version"] == "v2"
    for side in ("active", "candidate"):
        assert set(check[side]) == {"c_shared", "c_spec", "l_shared", "l_spec", "overall"}
        assert check[side]["overall"] is not None and 0 <= check[side]["overall"] <= 10
    assert check["passed"] == compare(check["active"], check["candidate"], 0.5)[0]
