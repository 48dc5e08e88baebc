"""How tokens reach experts. Pure functions over tensors; shapes: N tokens, K experts per token, E experts,
H hidden, I expert intermediate.

`grouped_experts` sorts the N*K (token, expert) assignments by expert and runs each *active* expert once over
its contiguous group of tokens; untouched experts cost nothing. `reference_experts` gathers every token's K
expert matrices and applies them with einsum: slow, memory hungry, obviously correct (the test oracle).

Both weight and sum the K expert outputs in the dtype of the routing weights, then cast to the input's dtype:
a softmax router hands model-dtype weights (Qwen3-MoE: combine in the model dtype), LLaDA2's sigmoid router
fp32 weights (its reference combines in fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """x [N, H], weights/ids [N, K], gate_up [E, 2I, H], down [E, H, I] -> [N, H]."""
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)  # [N*K]
    order = torch.argsort(flat_ids, stable=True)  # assignments grouped by expert
    token_of = order // top_k  # [N*K] source token of each sorted assignment
    counts = torch.bincount(flat_ids, minlength=gate_up.shape[0]).tolist()
    sorted_x = x.index_select(0, token_of)  # [N*K, H]
    sorted_out = torch.empty_like(sorted_x)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        gate, up = F.linear(sorted_x[rows], gate_up[expert]).chunk(2, dim=-1)
        sorted_out[rows] = F.linear(F.silu(gate) * up, down[expert])
        start += count
    sorted_out = sorted_out.to(weights.dtype) * weights.reshape(-1, 1).index_select(0, order)
    out = torch.zeros_like(x, dtype=weights.dtype)
    return out.index_add_(0, token_of, sorted_out).to(x.dtype)


def reference_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Same contract as `grouped_experts`; materialises [N, K, 2I, H] weights (tiny models only)."""
    gate, up = torch.einsum("nh,nkoh->nko", x, gate_up[ids]).chunk(2, dim=-1)  # [N, K, I] each
    expert_out = torch.einsum("nki,nkhi->nkh", F.silu(gate) * up, down[ids])  # [N, K, H]
    return torch.einsum("nkh,nk->nh", expert_out.to(weights.dtype), weights).to(x.dtype)
