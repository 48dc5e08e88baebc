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

**Backends** (`run_experts`): the expert-compute paths of a MoE layer and the rule that picks one per call.

    loop        one matmul pair per touched expert over its sorted run (grouped_experts): reads only the
                touched experts, but launches 2 small GEMMs per expert; the reference the fast paths are tested
                against, and the only path that pays when few experts are touched (batch-1 AR steps)
    bmm         the sorted runs padded to the longest run R and computed as two batched GEMMs over all E experts
                ([E, R, H] x [E, H, 2I], then [E, R, I] x [E, I, H]): each expert's weights are streamed once,
                by one kernel, in their checkpoint layout (contiguous per expert; the transposed views cost nothing,
                see docs/benchmarks/moe.md for the measured pre-transposed copy)
    grouped_mm  `torch._grouped_mm` (grouped_experts' CUDA path): no padding, one kernel per projection

`auto` picks by the measurements in docs/serving/moe.md ("Expert backends"), per device and dtype (`prefers_bmm`):
  CPU, fp32       the loop: fp32 bmm ran 0.66-0.75x the loop end to end in 2 of 3 runs (GEMMs of a few rows stream
                  weights as fast one expert at a time, and bmm computes the padding in slow fp32 FMAs)
  CPU, bf16/fp16  bmm when at least half of the experts are touched: 0.98-1.33x the bf16 loop's forwards/s end to
                  end in 3 runs (AMX makes the padding cheap; oneDNN repacks weights once per layer, not per expert)
  CUDA            grouped_mm where PyTorch has its kernel (bf16, sm90+); else bmm when at least half of the experts
                  are touched and padding at most doubles the rows (not yet measured on a GPU: conservative)
  otherwise       the loop
The padding guard matters for diffusion: a block's mask tokens have near-identical hidden states and crowd onto
the same experts, so the longest run can be many times the mean (`bench moe`, fp32, one request: 2.6 of 16
experts touched, bmm 6.8x slower than the loop).
Knows nothing of routing or of where weights live (offload and expert parallel keep the sorted-run loop).
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


BACKENDS = ("auto", "loop", "bmm", "grouped_mm")
BMM_MIN_TOUCHED_FRACTION = 0.5
"""auto: bmm when at least this fraction of the experts has tokens (below it, bmm would read mostly
weights no token needs)..."""
BMM_MAX_PADDING = 2.0
"""... and (CUDA) the padded rows E * R are at most this many times the assignments A."""


def prefers_bmm(num_experts: int, touched: int, longest: int, assignments: int, on_cuda: bool) -> bool:
    """auto's rule where bmm can pay (see the module docstring); the padding guard applies on CUDA only."""
    return touched >= BMM_MIN_TOUCHED_FRACTION * num_experts and (
        not on_cuda or num_experts * longest <= BMM_MAX_PADDING * assignments
    )


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"moe_backend: {backend!r} is not one of {', '.join(BACKENDS)}; pick one of those")
    return backend


def run_experts(
    backend: str, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """x [N, H], weights/ids [N, K], gate_up [E, 2I, H], down [E, H, I] -> [N, H] with the chosen backend."""
    if backend == "loop" or (backend == "auto" and not x.is_cuda and x.dtype == torch.float32):
        return grouped_experts(x, weights, ids, gate_up, down, allow_grouped_mm=False)
    if backend == "grouped_mm" or (backend == "auto" and grouped_mm_supported(x, gate_up)):
        return grouped_experts(x, weights, ids, gate_up, down)  # the loop where PyTorch has no fast kernel
    counts = torch.bincount(ids.reshape(-1), minlength=gate_up.shape[0])  # [E]
    # One host sync for both numbers: the touched experts and the longest run.
    touched, longest = torch.stack([(counts > 0).sum(), counts.max()]).tolist()
    if backend == "auto" and not prefers_bmm(gate_up.shape[0], touched, longest, ids.numel(), x.is_cuda):
        return grouped_experts(x, weights, ids, gate_up, down)
    return padded_bmm_experts(x, weights, ids, gate_up, down, counts, longest)


def padded_bmm_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    counts: torch.Tensor,
    rows: int,
) -> torch.Tensor:
    """The bmm backend. counts [E]: tokens per expert; rows >= max(counts): the padded run length R.

    Sorted position p (expert e, r-th token of e's run) lives at padded row e * R + r; padding rows are zero and
    their outputs are never read, so the result is the loop's up to GEMM summation order."""
    num_experts, hidden = gate_up.shape[0], x.shape[1]
    flat = ids.reshape(-1)  # [A]
    order = torch.argsort(flat, stable=True)
    expert_of = flat.index_select(0, order)  # [A] expert of each sorted position, ascending
    run_start = torch.cumsum(counts, 0) - counts  # [E]
    slot = expert_of * rows + torch.arange(flat.numel(), device=x.device) - run_start.index_select(0, expert_of)
    groups = ExpertGroups(order, order // ids.shape[1], [])
    padded = x.new_zeros(num_experts * rows, hidden).index_copy_(0, slot, x.index_select(0, groups.token_of))
    gate_up_out = torch.bmm(padded.view(num_experts, rows, hidden), gate_up.transpose(1, 2))  # [E, R, 2I]
    gate, up = gate_up_out.chunk(2, dim=-1)
    out = torch.bmm(F.silu(gate) * up, down.transpose(1, 2)).view(num_experts * rows, hidden)  # [E * R, H]
    return combine(out.index_select(0, slot), weights, groups, x.dtype, x.shape[0])
