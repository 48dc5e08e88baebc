"""QuantFusedExperts: a MoE layer's routed experts with quantized weights, in place of `FusedExperts` (same
interface: the sorted-run `run` that tensor / expert parallel and the grouped dispatch share, and `compute`, the
whole routed sum). Each touched expert runs once over its sorted run of tokens, with its two matrices read
quantized by the kernel of the device (kernels.py):

    gate_up_proj  [E, 2I, H]   rows [0, I) gate, [I, 2I) up          (QuantWeight, fused like FusedExperts)
    down_proj     [E, H, I]

so every backend of the float layer (loop, bmm, grouped_mm) becomes the sorted-run loop over quantized matrices:
the bmm and grouped_mm backends need the experts as one float tensor, which is what quantization avoids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.moe.dispatch import ExpertGroups, combine, group_by_expert
from diffuserve.model.layers.moe.layer import FusedExperts
from diffuserve.model.quant.formats import QuantFormat
from diffuserve.model.quant.weight import QuantWeight


class QuantFusedExperts(nn.Module):
    def __init__(self, experts: FusedExperts, formats: tuple[QuantFormat, QuantFormat], scale_dtype: torch.dtype):
        super().__init__()
        self.num_experts, self.intermediate_size = experts.num_experts, experts.intermediate_size
        self.expert_offset = experts.expert_offset
        gate_up, down = experts.gate_up_proj, experts.down_proj
        self.gate_up_proj = QuantWeight(formats[0], tuple(gate_up.shape), scale_dtype, getattr(gate_up, "shard", None))
        self.down_proj = QuantWeight(formats[1], tuple(down.shape), scale_dtype, getattr(down, "shard", None))

    @property
    def local_range(self) -> range:
        return range(self.expert_offset, self.expert_offset + self.num_experts)

    def expert(self, x: torch.Tensor, local: int) -> torch.Tensor:
        """Local expert `local`'s SwiGLU: x [M, H] -> [M, H]."""
        gate, up = self.gate_up_proj.linear(x, local).chunk(2, dim=-1)  # [M, I] each
        return self.down_proj.linear(F.silu(gate) * up, local)

    def run(self, sorted_x: torch.Tensor, groups: ExpertGroups, ids: torch.Tensor, sorted_out: torch.Tensor) -> None:
        for expert, rows in groups.runs(self.local_range):
            sorted_out[rows] = self.expert(sorted_x[rows], expert - self.expert_offset)

    def compute(self, backend: str, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], routing weights / ids [N, K] -> [N, H] (`backend` has no quantized variant: see above)."""
        groups = group_by_expert(ids, self.num_experts)
        sorted_x = x.index_select(0, groups.token_of)  # [A, H]
        sorted_out = torch.empty_like(sorted_x)
        self.run(sorted_x, groups, ids, sorted_out)
        return combine(sorted_out, weights, groups, x.dtype, x.shape[0])
