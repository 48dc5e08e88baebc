"""The expert-compute backends of a MoE layer and the rule that picks one per call.

    loop        one matmul pair per touched expert over its sorted run (dispatch.grouped_experts): reads only the
                touched experts, but launches 2 small GEMMs per expert; the reference the fast paths are tested
                against, and the only path that pays when few experts are touched (batch-1 AR steps)
    bmm         the sorted runs padded to the longest run R and computed as two batched GEMMs over all E experts
                ([E, R, H] x [E, H, 2I], then [E, R, I] x [E, I, H]): each expert's weights are streamed once,
                by one kernel, in their checkpoint layout (contiguous per expert; the transposed views cost nothing,
                see docs/moe.md for the measured pre-transposed copy)
    grouped_mm  `torch._grouped_mm` (dispatch.grouped_experts' CUDA path): no padding, one kernel per projection

`auto` picks by the measurements in docs/moe.md ("Expert backends"), per device and dtype (`prefers_bmm`):
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

import torch
import torch.nn.functional as F

from diffuserve.model.layers.moe.dispatch import ExpertGroups, combine, grouped_experts, grouped_mm_supported

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
