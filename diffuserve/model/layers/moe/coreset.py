"""Block expert coreset routing: while a diffusion block is denoised, its positions route to a coreset of C experts
chosen for the whole block, instead of each position to its own top-k of all E experts. The rule
(docs/models/coreset.md), for a block's L positions with router probabilities p [L, E] (fp32):

    phase one   coreset = the C experts with the largest sum of p over the block's positions (ties: lower id)
    phase two   each position's top-k of p restricted to the coreset (ties: lower id), the k weights divided by
                their sum (renormalised to 1)

Every block of a step has its own coreset; rows outside the step's denoised blocks (prefill, commits: the causal
path) keep their per-token routing, and so does everything when C >= E (the coreset is then every expert).
Knows nothing of requests: the block rows come from the step's offload_context. `set_block_coreset` turns a rule
(coreset_rule.py) on for every MoE layer of a model (the modules with a `coreset_size`); the cumulative rule's
routing is window_coreset.py's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from diffuserve.model.layers.moe.coreset_rule import CoresetRule
from diffuserve.model.layers.moe.offload_context import active_offload_context


def block_coreset(probs: torch.Tensor, size: int) -> torch.Tensor:
    """Phase one: probs [L, E] fp32 -> the block's coreset [C] (expert ids, largest summed probability first)."""
    return torch.sort(probs.sum(dim=0), descending=True, stable=True).indices[:size]


def route_in_coreset(probs: torch.Tensor, coreset: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase two: probs [L, E] fp32, coreset [C] -> (weights [L, K] fp32 summing to 1, expert ids [L, K])."""
    inside = probs.index_select(1, coreset)  # [L, C]
    top = torch.sort(inside, dim=-1, descending=True, stable=True).indices[:, :top_k]  # [L, K] coreset slots
    weights = inside.gather(1, top)
    return weights / weights.sum(dim=-1, keepdim=True), coreset[top]


def coreset_routing(
    probs: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    blocks: list[tuple[int, int]],
    size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [N, E] fp32 and the per-token routing weights / ids [N, K] of a step -> the routing with every
    block's rows (start, length) routed within its own coreset of `size` experts; other rows unchanged."""
    weights, ids = weights.clone(), ids.clone()
    for start, length in blocks:
        block_weights, block_ids = route_in_coreset(
            probs[start : start + length], block_coreset(probs[start : start + length], size), ids.shape[1]
        )
        weights[start : start + length] = block_weights.to(weights.dtype)
        ids[start : start + length] = block_ids
    return weights, ids


def step_coreset_routing(
    router: Any, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MoE layer's routing of x [N, H] (weights / ids [N, K] per token) with the current step's denoised
    blocks each routed within its coreset; unchanged outside an offload_context or without blocks. `router`: a
    module with `probabilities(x) -> [N, E] fp32` (set_block_coreset checked it)."""
    context = active_offload_context()
    if context is None or not context.blocks:
        return weights, ids
    blocks = [(block.start, block.length) for block in context.blocks]
    return coreset_routing(router.probabilities(x), weights, ids, blocks, size)


def set_block_coreset(model: nn.Module, rule: CoresetRule | None) -> None:
    """Every MoE layer of `model` routes by `rule` (None: per token). The fixed rule: each denoised block within
    a coreset of C experts, C at or above a layer's experts keeping per-token routing; the cumulative rule
    (window_coreset.py): every window, a group-limited router's layers only. ValueError where a layer cannot."""
    layers: list[Any] = [m for m in model.modules() if hasattr(m, "coreset_size")]
    if rule is not None and not layers:
        raise ValueError(f"block_expert_coreset: {rule.describe()} needs MoE layers; this model has none")
    for layer in layers:
        layer.coreset_size, layer.window_rule = 0, None
        if rule is not None and rule.every_window:
            _check_window_router(layer.gate, rule)
            layer.window_rule = rule
        elif rule is not None:
            _check_softmax_router(layer, rule.size)
            layer.coreset_size = rule.size if rule.size < layer.num_experts else 0


def _check_softmax_router(layer: Any, size: int) -> None:
    top_k = getattr(layer.gate, "top_k", 0)
    if not hasattr(layer.gate, "probabilities"):
        raise ValueError(
            f"block_expert_coreset: {size} needs a router with a distribution over the experts (softmax top-k); "
            f"this model's {type(layer.gate).__name__} has none; set 0, or a cumulative rule for a group-limited "
            "router"
        )
    if size < top_k:
        raise ValueError(f"block_expert_coreset: {size} is below the {top_k} experts per token; use >= {top_k}")


def _check_window_router(gate: Any, rule: CoresetRule) -> None:
    if not hasattr(gate, "expert_bias"):
        raise ValueError(
            f"block_expert_coreset: {rule.describe()} (dMoE's rule) needs a group-limited sigmoid router (one with an "
            f"expert bias); this model's {type(gate).__name__} is not one; give a fixed size C instead"
        )
