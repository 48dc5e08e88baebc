"""RMSNorm with the rounding of transformers' Gemma-4 reference: normalise *and* scale in fp32 (`x * (mean(x^2) +
eps)^-0.5 * weight`, the weight multiplying directly, not `1 + weight`), then round to the input dtype once. The
scale-free variant (`with_scale=False`: the v norm, the router's input norm, the self-conditioning output norm)
has no parameter."""

from __future__ import annotations

import torch
from torch import nn


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        # pow(-0.5), not rsqrt: the reference's choice, kept so fp32 results agree to the last bit more often.
        normed = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            normed = normed * self.weight.float()
        return normed.to(x.dtype)
