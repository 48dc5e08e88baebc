"""Quantizing 16/32-bit weights on load into the canonical parts (formats.py), row by row:

    int8  symmetric, one scale per output channel:  s = max|w| / 127,  q = round(w / s)            in [-127, 127]
    int4  asymmetric, groups of g input columns:    s = (max - min) / 15,  z = round(-min / s),
                                                    q = clamp(round(w / s) + z, 0, 15)
    fp8   e4m3, one fp32 scale per output channel:  s = max|w| / 448,  q = fp8(w / s)

Each row depends only on itself, so any block of rows can be quantized on its own (the loader quantizes a
checkpoint tensor in row chunks and shards the result). The scales of int8 / int4 are rounded to `scale_dtype`
(the model dtype, which the integer kernels take) *before* the values are computed, so the stored scale is the
one the values were divided by. Computes in fp32; knows nothing of modules or checkpoints.
"""

from __future__ import annotations

import torch

from diffuserve.model.quant.formats import FP8_MAX, QuantFormat, QuantParts

ON_LOAD_INT8 = QuantFormat("int8")
ON_LOAD_FP8 = QuantFormat("fp8")


def on_load_format(method: str, group_size: int) -> QuantFormat:
    """The format `--quantization method` quantizes into."""
    if method == "int4":
        return QuantFormat("int4", group_size=group_size, symmetric=False)
    return {"int8": ON_LOAD_INT8, "fp8": ON_LOAD_FP8}[method]


def _stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The scale as it will be stored (zero-range rows get 1: their values are all 0 anyway), back in fp32."""
    return torch.where(scale > 0, scale, torch.ones_like(scale)).to(dtype).float()


def quantize_int8(w: torch.Tensor, scale_dtype: torch.dtype) -> QuantParts:
    """w [*, N, K] -> int8 [*, N, K], scale [*, N, 1]."""
    w = w.float()
    scale = _stored(w.abs().amax(dim=-1, keepdim=True) / 127, scale_dtype)
    q = (w / scale).round_().clamp_(-127, 127).to(torch.int8)
    return QuantParts(q, scale.to(scale_dtype), None)


def quantize_int4(w: torch.Tensor, group_size: int, scale_dtype: torch.dtype) -> QuantParts:
    """w [*, N, K] -> nibbles uint8 [*, N, K / 2] (even column low), scale and zero [*, N, K / g]."""
    *lead, n, k = w.shape
    if k % group_size:
        raise ValueError(f"quantization_group_size: {group_size} does not divide the input width {k}")
    groups = w.to(torch.float32, copy=True).reshape(*lead, n, k // group_size, group_size)  # [*, N, G, g], own copy
    low, high = torch.aminmax(groups, dim=-1, keepdim=True)
    scale = _stored((high - low) / 15, scale_dtype)
    zero = torch.round(-low / scale).clamp_(0, 15)
    q = groups.div_(scale).round_().add_(zero).clamp_(0, 15).to(torch.uint8).reshape(*lead, n, k)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return QuantParts(packed, scale.squeeze(-1).to(scale_dtype), zero.squeeze(-1).to(scale_dtype))


def quantize_fp8(w: torch.Tensor) -> QuantParts:
    """w [*, N, K] -> float8_e4m3fn [*, N, K], fp32 scale [*, N, 1]."""
    w = w.float()
    scale = _stored(w.abs().amax(dim=-1, keepdim=True) / FP8_MAX, torch.float32)
    return QuantParts((w / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale, None)


def quantize(w: torch.Tensor, fmt: QuantFormat, scale_dtype: torch.dtype) -> QuantParts:
    """w [*, N, K] float -> its parts in `fmt` (one of the on-load formats)."""
    if fmt.method == "int8":
        return quantize_int8(w, scale_dtype)
    if fmt.method == "int4":
        assert fmt.group_size is not None, "on-load int4 is grouped"
        return quantize_int4(w, fmt.group_size, scale_dtype)
    return quantize_fp8(w)
