"""The LiPO loss (Eq. 5-6) and the pairwise-DPO ablation's loss, in torch.

A SOCA-weighted DPO-style logistic loss per candidate group, normalised by the group's
retained edge count, then averaged over groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from counselor_engine import _validate
from counselor_engine.soca import Edge


def group_loss(h: torch.Tensor, edges: Sequence[Edge]) -> torch.Tensor:
    """Eq. 5: (1/|E|) sum_{i>j in E} w_ij softplus(-(h_i - h_j)).

    ``h`` holds one beta-scaled policy-minus-reference sequence log-ratio per candidate.
    The sum is divided by the number of retained edges, not by the weight sum (App. C.1).
    Differentiable in ``h``; the edges and weights are fixed data.
    """
    return _edge_terms(h, edges).sum() / len(edges)


def pairwise_dpo_loss(groups: Sequence[tuple[torch.Tensor, Sequence[Edge]]]) -> torch.Tensor:
    """The pairwise-DPO ablation (paper Sec. 2.3 and Table 3): every SOCA edge i > j is one
    preferred/dispreferred pair with unit weight, and the loss is the plain mean of
    softplus(-(h_i - h_j)) over ALL pairs of the batch.

    Against Eq. 5-6 this drops both things LiPO adds: the SOCA strengths w_ij (each pair
    counts 1) and the per-group normalisation (a group with 10 edges weighs 10 times a
    group with one). For a single unit-weight edge the two objectives coincide.
    """
    if isinstance(groups, str) or not isinstance(groups, Sequence) or len(groups) == 0:
        raise ValueError("groups: empty")
    terms = [_edge_terms(h, edges, unit=True) for h, edges in groups]
    return torch.cat(terms).mean()


def _edge_terms(h: torch.Tensor, edges: Sequence[Edge], *, unit: bool = False) -> torch.Tensor:
    """w_ij softplus(-(h_i - h_j)) per edge (w = 1 when ``unit``), after checking both."""
    _check_utilities(h)
    if isinstance(edges, str) or not isinstance(edges, Sequence) or len(edges) == 0:
        raise ValueError("edges: empty group")
    winners, losers, weights = [], [], []
    for edge in edges:
        if not isinstance(edge, Edge):
            raise ValueError(f"edges: expected Edge objects, got {type(edge).__name__}")
        winner = _validate.integer("edges.winner", edge.winner, minimum=0)
        loser = _validate.integer("edges.loser", edge.loser, minimum=0)
        if max(winner, loser) >= h.shape[0]:
            raise ValueError(f"edges: index out of range for {h.shape[0]} candidates")
        if winner == loser:
            raise ValueError(f"edges: self-loop on candidate {winner}")
        winners.append(winner)
        losers.append(loser)
        weights.append(_validate.positive("edges.weight", edge.weight))
    index = torch.tensor([winners, losers], dtype=torch.long, device=h.device)
    margins = h[index[0]] - h[index[1]]
    if unit:
        return F.softplus(-margins)
    w = torch.tensor(weights, dtype=h.dtype, device=h.device)
    return w * F.softplus(-margins)


def _check_utilities(h: torch.Tensor) -> None:
    if not isinstance(h, torch.Tensor) or h.dim() != 1 or h.shape[0] == 0:
        raise ValueError("h: expected a non-empty 1-D tensor")
    if not h.is_floating_point():
        raise ValueError(f"h: expected a floating-point tensor, got {h.dtype}")
    if not bool(torch.isfinite(h.detach()).all()):
        raise ValueError("h: contains NaN or inf")


def population_loss(groups: Sequence[tuple[torch.Tensor, Sequence[Edge]]]) -> torch.Tensor:
    """Eq. 6: the plain mean of the group losses, so no group counts more for having more
    edges (clients then weigh in proportion to their admitted group counts)."""
    if isinstance(groups, str) or not isinstance(groups, Sequence) or len(groups) == 0:
        raise ValueError("groups: empty")
    losses = [group_loss(h, edges) for h, edges in groups]
    return torch.stack(losses).mean()
