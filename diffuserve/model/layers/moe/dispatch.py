"""How tokens reach experts. Pure functions over tensors; shapes: N tokens, K experts per token, E experts,
H hidden, I expert intermediate, A = N * K (token, expert) assignments.

The grouped dispatch runs in three phases that the offload and expert-parallel backends reuse:

    group_by_expert   sort the A assignments by expert: each expert's tokens become one contiguous run
    run_expert        one expert's SwiGLU over its run (two matmuls), wherever its weights live
    combine           weight the A outputs and sum each token's K of them back into [N, H]

so every expert is computed exactly once per step over all of the step's tokens routed to it, and untouched
experts cost nothing. `grouped_experts` uses `torch._grouped_mm` (one kernel for all experts) where PyTorch
offers it (CUDA bf16 on compute capability >= 9.0), the sorted-run loop elsewhere; both give the same rows.
`looped_experts` is the usual simple implementation (one-hot masks, a per-expert gather and scatter; the baseline
the benchmark compares against) and `reference_experts` the per-token einsum oracle.

All of them weight and sum the K expert outputs in the dtype of the routing weights, then cast to the input's
dtype: a softmax router hands model-dtype weights (Qwen3-MoE combines in the model dtype), LLaDA2's sigmoid
router fp32 weights (its reference combines in fp32).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpertGroups:
    """The step's assignments sorted by expert (stable, so each run keeps token order)."""

    order: torch.Tensor
    """[A] long: flat assignment index (token * K + k) of each sorted position."""
    token_of: torch.Tensor
    """[A] long: source token of each sorted position."""
    counts: list[int]
    """[E] tokens routed to each expert; expert e's run starts at sum(counts[:e])."""

    def runs(self, experts: range | None = None) -> list[tuple[int, slice]]:
        """(expert, rows of its run) for every expert with tokens, optionally only those in `experts`."""
        out, start = [], 0
        for expert, count in enumerate(self.counts):
            if count and (experts is None or expert in experts):
                out.append((expert, slice(start, start + count)))
            start += count
        return out


def group_by_expert(ids: torch.Tensor, num_experts: int) -> ExpertGroups:
    """ids [N, K] -> the assignments grouped by expert."""
    flat_ids = ids.reshape(-1)  # [A]
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    return ExpertGroups(order, order // ids.shape[1], counts)


def run_expert(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU: x [M, H], gate_up [2I, H], down [H, I] -> [M, H]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)  # [M, I] each
    return F.linear(F.silu(gate) * up, down)


def combine(
    sorted_out: torch.Tensor, weights: torch.Tensor, groups: ExpertGroups, out_dtype: torch.dtype, num_tokens: int
) -> torch.Tensor:
    """sorted_out [A, H] (expert outputs in sorted order), weights [N, K] -> [N, H] in `out_dtype`."""
    weighted = sorted_out.to(weights.dtype) * weights.reshape(-1, 1).index_select(0, groups.order)
    out = weighted.new_zeros(num_tokens, weighted.shape[1])
    return out.index_add_(0, groups.token_of, weighted).to(out_dtype)


_grouped_mm_state = {"usable": hasattr(torch, "_grouped_mm")}
"""Cleared (with a warning) the first time `torch._grouped_mm` refuses a call, so a PyTorch build or shape it
does not support falls back to the sorted-run loop instead of failing every step."""


def grouped_mm_supported(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """True where `torch._grouped_mm` has a fast kernel: CUDA, bf16, sm90+, 16-byte aligned rows."""
    if not (_grouped_mm_state["usable"] and x.is_cuda and gate_up.is_cuda):
        return False
    aligned = x.shape[-1] % 8 == 0 and gate_up.shape[1] % 16 == 0
    return (
        x.dtype == gate_up.dtype == torch.bfloat16 and aligned and torch.cuda.get_device_capability(x.device) >= (9, 0)
    )


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    allow_grouped_mm: bool = True,
) -> torch.Tensor:
    """x [N, H], weights/ids [N, K], gate_up [E, 2I, H], down [E, H, I] -> [N, H]. `allow_grouped_mm=False`:
    always the sorted-run loop (the reference backend, see backends)."""
    if allow_grouped_mm and grouped_mm_supported(x, gate_up):
        try:
            return _grouped_mm_experts(x, weights, ids, gate_up, down)
        except RuntimeError as e:
            _grouped_mm_state["usable"] = False
            logger.warning("torch._grouped_mm failed (%s); using the sorted-run loop from now on", e)
    groups = group_by_expert(ids, gate_up.shape[0])
    sorted_x = x.index_select(0, groups.token_of)  # [A, H]
    sorted_out = torch.empty_like(sorted_x)
    for expert, rows in groups.runs():
        sorted_out[rows] = run_expert(sorted_x[rows], gate_up[expert], down[expert])
    return combine(sorted_out, weights, groups, x.dtype, x.shape[0])


def _grouped_mm_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The same three phases with one grouped GEMM per projection; no host sync for the run lengths."""
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    ends = torch.cumsum(torch.bincount(flat_ids, minlength=gate_up.shape[0]), 0).to(torch.int32)  # [E]
    groups = ExpertGroups(order, order // ids.shape[1], [])
    sorted_x = x.index_select(0, groups.token_of)
    # _grouped_mm wants the per-expert matrices column-major: [E, H, 2I] and [E, I, H] as transposed views.
    gate, up = torch._grouped_mm(sorted_x, gate_up.transpose(1, 2), offs=ends).chunk(2, dim=-1)
    sorted_out = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=ends)  # [A, H]
    return combine(sorted_out, weights, groups, x.dtype, x.shape[0])


def looped_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The usual simple implementation (the benchmark's baseline): a one-hot mask [E, K, N], then for each hit
    expert find its (slot, token) pairs, gather those tokens, run the expert, scale and scatter-add back."""
    out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
    mask = F.one_hot(ids, gate_up.shape[0]).permute(2, 1, 0)  # [E, K, N]
    for expert in (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist():
        slot, token = torch.where(mask[expert])
        gate, up = F.linear(x[token], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[expert]).to(weights.dtype) * weights[token, slot, None]
        out.index_add_(0, token, y)
    return out.to(x.dtype)


def reference_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Same contract as `grouped_experts`; materialises [N, K, 2I, H] weights (tiny models only)."""
    gate, up = torch.einsum("nh,nkoh->nko", x, gate_up[ids]).chunk(2, dim=-1)  # [N, K, I] each
    expert_out = torch.einsum("nki,nkhi->nkh", F.silu(gate) * up, down[ids])  # [N, K, H]
    return torch.einsum("nkh,nk->nh", expert_out.to(weights.dtype), weights).to(x.dtype)
