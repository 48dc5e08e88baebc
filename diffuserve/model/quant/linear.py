"""QuantLinear: a linear layer whose weight is a QuantWeight, replacing an `nn.Linear` (whole or column-parallel)
or a `RowParallelLinear` once the model is built and sharded (the module keeps the replaced layer's shard layout,
its bias in the model dtype, and, row-parallel, the group it sums its partial output over).

    y = x @ W^T (+ bias)        x [..., K] -> y [..., N]; row-parallel: all-reduced first, the bias added once
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from diffuserve.model.layers.linear import RowParallelLinear
from diffuserve.model.quant.formats import QuantFormat
from diffuserve.model.quant.weight import QuantWeight

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class QuantLinear(nn.Module):
    def __init__(self, weight: QuantWeight, bias: nn.Parameter | None, group: ParallelGroup | None, reduce: bool):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias
        self.group, self.reduce = group, reduce

    @classmethod
    def replacing(
        cls, linear: nn.Linear | RowParallelLinear, fmt: QuantFormat, scale_dtype: torch.dtype
    ) -> QuantLinear:
        """The quantized counterpart of `linear` (on the meta device, parts uninitialised)."""
        shard = getattr(linear.weight, "shard", None)
        weight = QuantWeight(fmt, tuple(linear.weight.shape), scale_dtype, shard)
        if isinstance(linear, RowParallelLinear):
            return cls(weight, linear.bias, linear.group, linear.reduce)
        return cls(weight, linear.bias, None, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self.weight.linear(x.reshape(-1, self.in_features)).view(*lead, self.out_features)
        if self.group is not None:
            if not self.reduce:
                return y
            y = self.group.all_reduce(y)
        return y if self.bias is None else y + self.bias
