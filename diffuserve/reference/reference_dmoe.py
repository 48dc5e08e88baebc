"""dMoE's block-expert routing in the naive reference, restated from its gate's rule (docs/models/dmoe.md, "dMoE") and
sharing no code with the engine's (model/layers/moe/window_coreset.py, coreset_rule.py, dispatch.py): while the
reference computes a [1, T] forward from position 0, every MoE layer's output is replaced, row by row, by this
module's own computation:

    1. for each window of 32 positions [32 w, 32 w + 32) (the last may be shorter): every position's top-k
       experts by biased score b = sigmoid(router logit) + expert_bias vote with their b; the votes are summed per
       expert and divided by their total (+ 1e-20);
    2. experts in descending vote order, running sum c_i: expert i is kept if it is the first, if c_i <= T, or if
       c_i > T while c_(i-1) <= T; fewer than 16 kept: the 16 largest votes instead (those tied at 0 as
       `torch.topk` picks them: see below);
    3. each position: b outside the coreset is -inf; a group scores the sum of its two best; the best
       `topk_group` groups, then the top-k experts in them; weight = sigmoid score / (sum of the k + 1e-20),
       times routed_scaling_factor (the division only when k > 1);
    4. out = sum of weight * SwiGLU_expert(x), expert by expert, plus the shared expert.

Python floats (double) sum the votes. The choices among equal values are `torch.topk`'s in dMoE's gate, an order
no rule states, so they are made by that call here too: the guard's experts tied at 0 votes (fewer than 16
experts voted), and in step 3 the groups and experts tied at -inf (fewer than `topk_group` groups hold two
coreset experts). Only layers with the group-limited router (`gate.expert_bias`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.moe.layer import SparseMoeBlock
from diffuserve.reference.reference_coreset import expert_output

WINDOW = 32
"""dMoE's gate: positions per window."""
GUARD = 16
"""dMoE's gate: the fewest experts a window's coreset keeps."""


@contextmanager
def dmoe_routing(model: nn.Module, threshold: float | None) -> Iterator[None]:
    """Within the context, the MoE layers of `model` route every row of a [1, T] forward by dMoE's rule with
    `core_threshold` = threshold (None: leaves the model alone)."""
    layers = [m for m in model.modules() if isinstance(m, SparseMoeBlock)] if threshold is not None else []

    def replace_rows(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert isinstance(module, SparseMoeBlock) and threshold is not None
        x = inputs[0].reshape(-1, inputs[0].shape[-1])  # [T, H], row = position
        return _dmoe_layer(module, x, threshold).view(output.shape)

    hooks = [layer.register_forward_hook(replace_rows) for layer in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def window_coreset(biased: list[list[float]], top_k: int, threshold: float) -> set[int]:
    """One window's rows of biased scores -> its coreset (expert ids)."""
    experts = len(biased[0])
    votes = [0.0] * experts
    for row in biased:
        for expert in sorted(range(experts), key=lambda e: -row[e])[:top_k]:
            votes[expert] += row[expert]
    total = sum(votes) + 1e-20
    shares = [vote / total for vote in votes]
    order = sorted(range(experts), key=lambda e: -shares[e])
    kept, running, was_past = [], 0.0, False
    for i, expert in enumerate(order):
        running += shares[expert]
        past = running > threshold
        if i == 0 or not past or not was_past:
            kept.append(expert)
        was_past = past
    guard = min(GUARD, experts)
    if len(kept) >= guard:
        return set(kept)
    # Fewer than 16 experts may have votes at all (a block of mask tokens votes alike): which of the unvoted,
    # tied at 0, fill the guard is torch.topk's choice in dMoE's gate, so it is made by that call here.
    return set(torch.topk(torch.tensor(votes, dtype=torch.float32), guard).indices.tolist())


def _route(gate: Any, scores: list[float], biased: list[float], coreset: set[int]) -> list[tuple[int, float]]:
    """One position inside its window's coreset -> [(expert, weight)] of its top-k."""
    experts, groups = len(scores), gate.num_groups
    size = experts // groups
    masked = [biased[e] if e in coreset else -math.inf for e in range(experts)]
    group_scores = [sum(sorted(masked[g * size : (g + 1) * size], reverse=True)[:2]) for g in range(groups)]
    kept = set(torch.topk(torch.tensor(group_scores), gate.topk_groups, sorted=False).indices.tolist())
    eligible = [masked[e] if e // size in kept else -math.inf for e in range(experts)]
    chosen = torch.topk(torch.tensor(eligible), gate.top_k).indices.tolist()
    total = sum(scores[e] for e in chosen) + 1e-20 if gate.top_k > 1 else 1.0
    return [(e, scores[e] / total * gate.scaling_factor) for e in chosen]


def _dmoe_layer(layer: SparseMoeBlock, x: torch.Tensor, threshold: float) -> torch.Tensor:
    """x [T, H] -> the layer's output under dMoE's routing [T, H]."""
    gate: Any = layer.gate
    scores = torch.sigmoid(F.linear(x.float(), gate.weight.float()))  # [T, E] fp32
    biased = (scores + gate.expert_bias.float()).tolist()
    scores_list = scores.tolist()
    rows = []
    for start in range(0, x.shape[0], WINDOW):
        coreset = window_coreset(biased[start : start + WINDOW], gate.top_k, threshold)
        for i in range(start, min(start + WINDOW, x.shape[0])):
            row = torch.zeros(x.shape[1], dtype=torch.float32)
            for expert, weight in _route(gate, scores_list[i], biased[i], coreset):
                row = row + weight * expert_output(layer, expert, x[i]).float()
            rows.append(row.to(x.dtype))
    out = torch.stack(rows)
    shared = layer.shared_output(x)
    return out if shared is None else out + shared
