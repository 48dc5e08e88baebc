"""SwiGLU feed-forward (dense layers and shared experts). `gate_up_proj` packs gate_proj | up_proj rows.
Under tensor parallelism (`shard_`) each rank keeps I / size of the width: gate_up column-, down row-parallel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.linear import RowParallelLinear, column_parallel

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj: nn.Linear | RowParallelLinear = nn.Linear(intermediate_size, hidden_size, bias=False)

    def shard_(self, group: ParallelGroup, reduce: bool = True) -> None:
        """Keeps this rank's slice of the width; `reduce=False` leaves the output a partial sum (see moe)."""
        width = self.intermediate_size
        assert isinstance(self.down_proj, nn.Linear), "SwiGLU.shard_ runs once, on the unsharded layer"
        self.gate_up_proj = column_parallel(self.gate_up_proj, (width, width), group)
        self.down_proj = RowParallelLinear(self.down_proj, (width,), group, reduce)
        self.intermediate_size = width // group.size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
