"""The dequantizing matmul: any format, any device, any activation dtype. y = x @ W^T where W is rebuilt from its
parts one slab of output rows at a time (a multiple of the format's row block, about a megabyte of weights), so a
full-precision copy of W never exists. It is the fallback of every other kernel (fp8 on a machine without fp8
matmuls, int4 groups the packed kernels do not take, fp32 activations on the CPU, where torch's integer kernels
are 20-50x slower than dequantizing) and the CPU's fp8 path. Knows nothing of modules or checkpoints.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffuserve.model.quant.formats import QuantFormat, QuantParts

SLAB_ELEMENTS = 1 << 18
"""Weights dequantized at once (1 MiB in fp32): small enough to stay in cache while its matmul reads it."""


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K / 2] uint8 (even column in the low nibble) -> [..., K] uint8 values 0..15."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _rows_per_slab(fmt: QuantFormat, k: int) -> int:
    rows = max(1, SLAB_ELEMENTS // max(k, 1))
    return max(fmt.row_block, rows // fmt.row_block * fmt.row_block)


def _per_column(values: torch.Tensor, group_size: int | None, k: int) -> torch.Tensor:
    """[R, G] per-group values -> [R, K] (or [R, 1] per channel, which broadcasts)."""
    return values if group_size is None else values.repeat_interleave(group_size, dim=1)[:, :k]


def _dequantize_rows(fmt: QuantFormat, parts: QuantParts, rows: slice, dtype: torch.dtype) -> torch.Tensor:
    """Output rows `rows` of W [R, K] in `dtype`."""
    q = parts.qdata[rows]
    values = (unpack_nibbles(q) if fmt.method == "int4" else q).to(dtype)  # [R, K]
    r, k = values.shape
    if fmt.method == "int4":
        zero = parts.zero[rows] if parts.zero is not None else torch.full((r, fmt.groups(k)), 8.0, device=q.device)
        values = values - _per_column(zero.to(dtype), fmt.group_size, k)
    scale = parts.scale[rows.start // fmt.row_block : -(-rows.stop // fmt.row_block)].to(dtype)
    scale = scale.repeat_interleave(fmt.row_block, dim=0)[:r]  # [R, G]; slabs start on a row block
    return values * _per_column(scale, fmt.group_size, k)


def _per_row_scaled(fmt: QuantFormat, parts: QuantParts) -> bool:
    """One scale per output row and no zero (int8, fp8 per channel): the scale can multiply the product instead."""
    return fmt.method != "int4" and fmt.group_size is None and fmt.row_block == 1


def _slab(x: torch.Tensor, fmt: QuantFormat, parts: QuantParts, rows: slice) -> torch.Tensor:
    """x @ W[rows]^T; per-row scales applied to the [M, R] product, not to the [R, K] weights (one pass less)."""
    if _per_row_scaled(fmt, parts):
        product = F.linear(x, parts.qdata[rows].to(x.dtype))
        return product * parts.scale[rows].reshape(1, -1).to(x.dtype)
    return F.linear(x, _dequantize_rows(fmt, parts, rows, x.dtype))


def dequant_matmul(x: torch.Tensor, fmt: QuantFormat, parts: QuantParts) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; parts of one matrix W [N, K]."""
    n, k = parts.qdata.shape[0], parts.qdata.shape[1] * fmt.pack
    step = _rows_per_slab(fmt, k)
    if step >= n:
        return _slab(x, fmt, parts, slice(0, n))
    out = x.new_empty(x.shape[0], n)
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        out[:, rows] = _slab(x, fmt, parts, rows)
    return out
