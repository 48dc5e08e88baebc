"""The cumulative coreset rule (coreset_rule.py; dMoE's gate) for the group-limited sigmoid router: every window of
a forward's rows picks its coreset, then every row routes group-limited top-k inside its window's coreset.

For a window's L rows (L = the rule's window, 32, unless a forward holds fewer of the window's rows) with sigmoid
scores s [L, E] and biased scores b = s + expert_bias:

    votes     each row keeps its top-k of b (all experts, no groups), the rest 0; summed over the rows [E],
              divided by (their sum + 1e-20)
    coreset   votes sorted descending, cumulative sums c: the experts with c <= T, the first expert, and the
              first with c > T; when that is fewer than `min`, instead the `min` largest votes
    routing   b outside the coreset set to -inf; a group's score is the sum of its two best (so a group holding
              one coreset expert scores -inf, as an empty one does); the best `topk_group` groups; the top-k of
              the rest; weights = s at those experts, divided by (their sum + 1e-20) when k > 1, times
              routed_scaling_factor

Ties go where `torch.topk` / `torch.sort` put them, the calls dMoE's gate makes: the guard's experts tied at 0
votes (fewer than `min` experts voted, as in a block of mask tokens), groups tied at -inf (fewer than
`topk_group` groups with two coreset experts) and experts tied at -inf (fewer than k routable) are chosen by
them, so a kept one-expert group routes its expert and a row can take an expert outside the coreset at weight
s. The windows' rows come from the step's offload_context (`windows`); knows nothing of requests.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from diffuserve.model.layers.moe.coreset_rule import CoresetRule
from diffuserve.model.layers.moe.offload_context import active_offload_context

EPS = 1e-20
"""Added to a sum before dividing by it, as dMoE's gate does."""


def cumulative_coreset(biased: torch.Tensor, top_k: int, threshold: float, minimum: int) -> torch.Tensor:
    """biased [W, L, E] fp32 (W windows of L rows) -> each window's coreset [W, E] bool."""
    local, local_ids = torch.topk(biased, k=top_k, dim=-1)  # [W, L, K]
    votes = torch.zeros_like(biased).scatter_(-1, local_ids, local).sum(dim=1)  # [W, E]
    votes = votes / (votes.sum(dim=-1, keepdim=True) + EPS)
    ordered, order = torch.sort(votes, dim=-1, descending=True)
    cumulative = torch.cumsum(ordered, dim=-1)
    past = cumulative > threshold
    first_past = past & ~torch.cat([torch.zeros_like(past[:, :1]), past[:, :-1]], dim=-1)
    keep = (cumulative <= threshold) | first_past
    keep[:, 0] = True
    coreset = torch.zeros_like(keep).scatter_(1, order, keep)
    guard = min(minimum, votes.shape[1])
    short = coreset.sum(dim=-1) < guard  # [W]
    if short.any():
        best = torch.zeros_like(coreset).scatter_(1, torch.topk(votes, k=guard, dim=-1).indices, True)
        coreset = torch.where(short[:, None], best, coreset)
    return coreset


def route_within(
    scores: torch.Tensor, biased: torch.Tensor, allowed: torch.Tensor, gate: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores / biased [N, E] fp32, allowed [N, E] bool (each row's coreset) -> (weights [N, K] fp32, ids [N, K])
    by the group-limited top-k of `gate` (top_k, num_groups, topk_groups, scaling_factor) inside `allowed`."""
    rows, experts = biased.shape
    masked = biased.masked_fill(~allowed, float("-inf"))
    group_scores = masked.view(rows, gate.num_groups, -1).topk(2, dim=-1)[0].sum(dim=-1)  # [N, G]
    groups = torch.topk(group_scores, k=gate.topk_groups, dim=-1, sorted=False)[1]
    kept = torch.zeros_like(group_scores).scatter_(1, groups, 1).bool()
    kept = kept[:, :, None].expand(rows, gate.num_groups, experts // gate.num_groups).reshape(rows, experts)
    ids = torch.topk(masked.masked_fill(~kept, float("-inf")), k=gate.top_k, dim=-1)[1]  # [N, K]
    weights = scores.gather(1, ids)
    if gate.top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + EPS)
    return weights * gate.scaling_factor, ids


def window_coreset_routing(
    gate: Any, x: torch.Tensor, windows: list[tuple[int, int]], rule: CoresetRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H] and the forward's windows (first row, row count; covering every row) -> (weights, ids) [N, K].
    Windows of the same length are computed together, [W, L, E] (one call for a step's whole windows)."""
    scores = torch.sigmoid(F.linear(x.float(), gate.weight.float()))  # [N, E] fp32
    biased = scores + gate.expert_bias.float()
    allowed = torch.zeros_like(biased, dtype=torch.bool)
    for length in sorted({length for _, length in windows}):
        starts = torch.tensor([start for start, n in windows if n == length], device=x.device)
        rows = (starts[:, None] + torch.arange(length, device=x.device)).flatten()  # [W * L]
        coreset = cumulative_coreset(
            biased[rows].view(-1, length, biased.shape[1]), gate.top_k, rule.threshold, rule.minimum
        )
        allowed[rows] = coreset.repeat_interleave(length, dim=0)
    return route_within(scores, biased, allowed, gate)


def step_window_routing(
    gate: Any, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rule: CoresetRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MoE layer's routing of the step's rows under the cumulative rule; the per-token routing (weights / ids)
    outside an engine step (a forward without the step's windows)."""
    context = active_offload_context()
    if context is None or not context.windows:
        return weights, ids
    return window_coreset_routing(gate, x, list(context.windows), rule)


def forward_windows(positions: list[int], window: int) -> tuple[tuple[int, int], ...]:
    """A step's row positions [N] -> its windows (first row, row count): runs of consecutive positions inside one
    window-aligned span [w * window, (w + 1) * window); requests' rows never share a run (a request's rows start
    at a block, window-aligned)."""
    spans: list[list[int]] = []
    for row, position in enumerate(positions):
        if spans and position == positions[row - 1] + 1 and position % window:
            spans[-1][1] += 1
        else:
            spans.append([row, 1])
    return tuple((start, length) for start, length in spans)
