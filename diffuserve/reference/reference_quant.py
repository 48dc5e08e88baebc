"""The obviously-correct dequantization of the canonical quantized parts (model/quant/formats.py), for tests: every
element of W gathered from its own scale and zero by index arithmetic, in float64. Shares no code with the
kernels (model/quant/dequant_kernel.py, kernels_cpu.py, kernels_cuda.py), which it is the oracle of:

    W[n, k] = (q[n, k] - zero[n, k // g]) * scale[n // row_block, k // g]     (zero 8 for symmetric int4, else 0)
"""

from __future__ import annotations

import torch

from diffuserve.model.quant.formats import QuantFormat, QuantParts


def reference_values(fmt: QuantFormat, qdata: torch.Tensor) -> torch.Tensor:
    """qdata [N, K / pack] -> q [N, K] float64 (int4: byte b holds column 2c in bits 0-3, 2c + 1 in bits 4-7)."""
    if fmt.method != "int4":
        return qdata.to(torch.float64)
    n, half = qdata.shape
    q = torch.empty(n, 2 * half, dtype=torch.float64)
    as_int = qdata.to(torch.int64)
    q[:, 0::2] = (as_int % 16).double()
    q[:, 1::2] = (as_int // 16).double()
    return q


def reference_dequantize(fmt: QuantFormat, parts: QuantParts) -> torch.Tensor:
    """One matrix's parts -> W [N, K] in float64."""
    q = reference_values(fmt, parts.qdata)
    n, k = q.shape
    rows = torch.arange(n)[:, None].expand(n, k)
    cols = torch.arange(k)[None, :].expand(n, k)
    group = cols // fmt.group_size if fmt.group_size is not None else torch.zeros_like(cols)
    scale = parts.scale.double()[rows // fmt.row_block, group]
    if parts.zero is not None:
        zero = parts.zero.double()[rows, group]
    else:
        zero = torch.full((n, k), 8.0 if fmt.method == "int4" else 0.0, dtype=torch.float64)
    return (q - zero) * scale


def reference_linear(x: torch.Tensor, fmt: QuantFormat, parts: QuantParts) -> torch.Tensor:
    """x [M, K] -> x @ W^T [M, N] in float64."""
    return x.double() @ reference_dequantize(fmt, parts).T
