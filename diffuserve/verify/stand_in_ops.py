"""The arithmetic of the stand-ins `diffuserve verify` gives a reference's imports that cannot load on this
machine (stand_ins.py): flash-attn's RMSNorm and attention, and einops' `rearrange`, each computing what the
named function computes, in plain PyTorch, for the arguments a reference passes in eval mode; any other use
raises NotImplementedError naming the argument. Knows nothing of which reference calls them.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F


def _used(rest: dict[str, object]) -> list[str]:
    """The keyword arguments given a value other than their defaults' 'off'."""
    return [k for k, v in rest.items() if isinstance(v, torch.Tensor) or v not in (None, False, 0.0, (-1, -1))]


def rms_norm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    dropout_p: float = 0.0,
    prenorm: bool = False,
    **rest: object,
) -> torch.Tensor:
    """flash_attn.ops.triton.layer_norm.rms_norm_fn: x * rsqrt(mean(x^2) + eps) * weight (+ bias), in float32
    as its Triton kernel computes it, returned in x's dtype."""
    used = _used(rest)
    if residual is not None or dropout_p or prenorm or used:
        raise NotImplementedError(f"verify's rms_norm_fn stand-in: residual/dropout/prenorm/{used} not covered")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **rest: object,
) -> torch.Tensor:
    """flash_attn.flash_attn_func on [B, L, H, D] tensors (K/V with fewer heads: grouped-query attention), as
    scaled dot-product attention; a causal mask is aligned to the bottom right, as flash-attn aligns it."""
    used = _used(rest)
    if dropout_p or used:
        raise NotImplementedError(f"verify's flash_attn_func stand-in: dropout/{used} not covered")
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
    mask = None
    if causal:
        lq, lk = q_.shape[-2], k_.shape[-2]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=softmax_scale, enable_gqa=True)
    return out.transpose(1, 2)


_AXES = re.compile(r"\(([^()]*)\)|(\w+)")


def _groups(side: str) -> list[list[str]]:
    return [group.split() if group else [name] for group, name in _AXES.findall(side)]


def rearrange(tensor: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
    """einops.rearrange for patterns whose left side names single axes (a permutation, then merges on the right,
    as in 'b h l d -> b l (h d)'); other patterns raise."""
    left, right = (_groups(side) for side in pattern.split("->"))
    if any(len(g) != 1 for g in left) or sizes or len(left) != tensor.dim():
        raise NotImplementedError(f"verify's rearrange stand-in: pattern {pattern!r} not covered")
    names = [g[0] for g in left]
    order = [names.index(name) for group in right for name in group]
    permuted = tensor.permute(order)
    shape, i = [], 0
    for group in right:
        size = 1
        for _ in group:
            size, i = size * permuted.shape[i], i + 1
        shape.append(size)
    return permuted.reshape(shape)
