"""The CPU's quantized matmuls: torch's weight-only integer kernels, which read the weights in 8 or 4 bits and
convert them in registers (bf16 / fp16 activations; with fp32 activations they are 20-50x slower than
dequantizing, so fp32 takes the dequantizing matmul, see kernels.select_kernel).

    int8  torch._weight_int8pack_mm(x [M, K], q int8 [N, K], scale [N])                      per output channel
    int4  torch._weight_int4pack_mm_for_cpu(x, packed, g, scale_and_zero [K / g, N, 2])     groups of g columns
          with W = (q - 8) * scale + zero', so our integer zero point z folds into zero' = (8 - z) * scale
          (computed in fp32, stored in the activation dtype: in bf16 that rounds a term of at most 8 scales by
          2^-9, under 6 % of the quantization step)

torchao was measured here (docs/benchmarks/quantization.md): its int8 weight-only path ran 4.9x slower than the
direct kernel and its int4 layouts do not run on a CPU, so these call torch's kernels directly.
Each kernel: `prepare` turns one matrix's canonical parts (formats.py) into its own tensors, `matmul` uses them.
"""

from __future__ import annotations

import torch

from diffuserve.model.quant.dequant_kernel import unpack_nibbles
from diffuserve.model.quant.formats import QuantFormat, QuantParts


def folded_scale_and_zero(fmt: QuantFormat, parts: QuantParts, dtype: torch.dtype) -> torch.Tensor:
    """int4 scale [N, G] and zero [N, G] (8 when symmetric) -> [G, N, 2]: (scale, (8 - zero) * scale) in `dtype`,
    the layout of torch's CPU and CUDA int4 kernels."""
    scale = parts.scale.float()
    zero = parts.zero.float() if parts.zero is not None else torch.full_like(scale, 8.0)
    return torch.stack((scale, (8 - zero) * scale), dim=-1).transpose(0, 1).contiguous().to(dtype)


class Int8PackKernel:
    name = "int8pack"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]:
        return {"qdata": parts.qdata.contiguous(), "scale": parts.scale.reshape(-1).to(self.dtype)}

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, tensors["qdata"], tensors["scale"])


class Int4PackCpuKernel:
    name = "int4pack-cpu"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]:
        values = unpack_nibbles(parts.qdata).to(torch.int32)  # [N, K]
        packed = torch._convert_weight_to_int4pack_for_cpu(values.contiguous(), 1)  # [N, K / 2] uint8
        return {"packed": packed, "scale_and_zero": folded_scale_and_zero(fmt, parts, self.dtype)}

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        assert fmt.group_size is not None, "the int4 kernel takes grouped weights"
        return torch._weight_int4pack_mm_for_cpu(x, tensors["packed"], fmt.group_size, tensors["scale_and_zero"])
