"""Mixture-of-Experts layer: a softmax top-k router, the routed experts' weights, an optional shared expert.

The layer holds weights; *how* tokens reach experts is a dispatch function (`moe_dispatch`), so the grouped
path and the obviously-correct reference path compute from the same parameters.

Expert weights are stored fused, in transformers 5's layout (the loader maps per-expert checkpoint names in):
    experts.gate_up_proj [E, 2 * I, H]   rows [0, I) = gate_proj, [I, 2I) = up_proj
    experts.down_proj    [E, H, I]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe_dispatch import grouped_experts, reference_experts


def softmax_topk(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE / SDAR-MoE routing. logits [N, E] -> (weights [N, K] in the logits' dtype, expert ids [N, K]).

    softmax in fp32 over all experts, keep the top-k, and renormalise them to sum 1 iff the HF config flag
    `norm_topk_prob` is true (Qwen3-MoE, SDAR-MoE: true; OLMoE-style LLaDA-MoE: false).
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


class FusedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class Router(nn.Module):
    """`gate.weight` [E, H]: the router logits are a plain linear map of the token's hidden state."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return softmax_topk(F.linear(x, self.weight), self.top_k, self.norm_topk_prob)


class SparseMoeBlock(nn.Module):
    """Routed experts (+ shared expert). `use_reference` switches to the per-token reference dispatch.
    `last_expert_ids` [N, K] keeps the latest routing for the engine's expert statistics.

    `gate` replaces the softmax top-k router: any module mapping hidden states [N, H] to (weights [N, K],
    expert ids [N, K]), e.g. LLaDA2's group-limited sigmoid router (top_k and norm_topk_prob are then its own)."""

    use_reference: bool = False

    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
        norm_topk_prob: bool, shared_intermediate_size: int = 0, gate: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.last_expert_ids: torch.Tensor | None = None
        self.gate = gate if gate is not None else Router(num_experts, hidden_size, top_k, norm_topk_prob)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size)
        self.shared_experts = SwiGLU(hidden_size, shared_intermediate_size) if shared_intermediate_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [N, H]
        weights, ids = self.gate(flat)  # [N, K]
        self.last_expert_ids = ids
        dispatch = reference_experts if self.use_reference else grouped_experts
        out = dispatch(flat, weights, ids, self.experts.gate_up_proj, self.experts.down_proj)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape)
