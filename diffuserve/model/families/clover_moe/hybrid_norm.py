"""The two RMSNorms of the Qwen3.5 / Clover trunk, with transformers' rounding.

`ZeroCenteredRMSNorm` (decoder norms, final norm, attention q/k norms): the weight is stored centred on zero and
applied as `1 + weight`, all in fp32, then rounded once to the input dtype. `GatedRMSNorm` (the GDN output
norm): `weight` as is, and the output gated by `silu(z)`: `rms(o) * weight * silu(z)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rms(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_rms(x.float(), self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate [..., dim] -> [..., dim] in x's dtype (the normed value is rounded before the weight)."""
        normed = self.weight * _rms(x.float(), self.eps).to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)
