"""CUDA adapters (not run on the machines this project is built on; tested on the CPU against the kernels'
documented contracts, tests/model/quant/test_kernels.py):

    fp8   torch._scaled_mm(a fp8 [M, K], b fp8 [K, N] column-major, scale_a [M, 1], scale_b [1, N], out_dtype):
          per-channel weights with per-token activation scales computed on the fly (the "dynamic" activation
          scheme of the Qwen / DeepSeek FP8 releases: activations also pass through fp8). Row-wise scales need
          sm90; sm89 takes one activation scale per tensor and applies the weight scales after the product.
    int4  torch._weight_int4pack_mm(x bf16 [M, K], packed, g, scale_and_zero [K / g, N, 2]) (tinygemm, the
          kernel torchao's int4 weight-only layout runs), packed by torch._convert_weight_to_int4pack from
          uint8 [N, K / 2] holding the *even* column in the high nibble.

Anything else on CUDA runs the dequantizing matmul (dequant_kernel).
"""

from __future__ import annotations

import torch

from diffuserve.model.quant.dequant_kernel import unpack_nibbles
from diffuserve.model.quant.formats import FP8_MAX, QuantFormat, QuantParts
from diffuserve.model.quant.kernels_cpu import folded_scale_and_zero

INNER_K_TILES = (8, 4, 2)
"""tinygemm's inner K tiles, largest first; K must be a multiple of 16 x the tiles."""


def inner_k_tiles(k: int) -> int | None:
    return next((tiles for tiles in INNER_K_TILES if k % (16 * tiles) == 0), None)


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], fp32 scale [M, 1]) with x ~= fp8 * scale (one scale per row)."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp_(min=1e-12)
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


class ScaledMmFp8Kernel:
    name = "scaled-mm-fp8"

    def __init__(self, dtype: torch.dtype, rowwise: bool) -> None:
        self.dtype, self.rowwise = dtype, rowwise

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]:
        # qdata [N, K] row-major: its transpose is the column-major [K, N] operand _scaled_mm wants.
        return {"qdata": parts.qdata.contiguous(), "scale": parts.scale.reshape(1, -1).float()}

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        weight, weight_scale = tensors["qdata"].t(), tensors["scale"]
        if self.rowwise:
            a, a_scale = per_token_fp8(x)
            return torch._scaled_mm(a, weight, a_scale, weight_scale, out_dtype=x.dtype)
        a_scale = (x.abs().amax().float() / FP8_MAX).clamp_(min=1e-12)
        a = (x.float() / a_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        one = torch.ones((), device=x.device)
        out = torch._scaled_mm(a, weight, a_scale, one, out_dtype=torch.float32)
        return (out * weight_scale).to(x.dtype)


class TinyGemmInt4Kernel:
    name = "tinygemm-int4"

    def __init__(self, dtype: torch.dtype, tiles: int) -> None:
        self.dtype, self.tiles = dtype, tiles

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]:
        values = unpack_nibbles(parts.qdata)  # [N, K] 0..15
        high_even = ((values[:, 0::2] << 4) | values[:, 1::2]).contiguous()  # [N, K / 2] uint8
        packed = torch._convert_weight_to_int4pack(high_even, self.tiles)
        return {"packed": packed, "scale_and_zero": folded_scale_and_zero(fmt, parts, self.dtype)}

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        assert fmt.group_size is not None, "the int4 kernel takes grouped weights"
        return torch._weight_int4pack_mm(x, tensors["packed"], fmt.group_size, tensors["scale_and_zero"])
