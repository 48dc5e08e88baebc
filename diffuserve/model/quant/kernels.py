"""Which matmul a quantized weight runs, per device, activation dtype, format and shape (`select_kernel`):

    device  format                                    activations   kernel
    cpu     int8 per channel                          bf16 / fp16   int8pack (kernels_cpu)
    cpu     int4, g in 32/64/128/256, N % 16 == 0     bf16 / fp16   int4pack-cpu (kernels_cpu)
    cuda    fp8 per channel, sm89+, N, K % 16 == 0    bf16 / fp16   scaled-mm-fp8 (kernels_cuda)
    cuda    int4, g in 32..256, N % 8, K % 32 == 0    bf16          tinygemm-int4 (kernels_cuda)
    any     anything else (fp8 on the CPU, fp32)      any           dequant (dequant_kernel)

fp8 weights on a device without fp8 matmuls log one line saying they are dequantized. A kernel has `prepare`
(one matrix's canonical parts -> its tensors) and `matmul` (x [M, K], those tensors -> [M, N]).
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from diffuserve.model.quant.dequant_kernel import dequant_matmul
from diffuserve.model.quant.formats import QuantFormat, QuantParts
from diffuserve.model.quant.kernels_cpu import Int4PackCpuKernel, Int8PackKernel
from diffuserve.model.quant.kernels_cuda import ScaledMmFp8Kernel, TinyGemmInt4Kernel, inner_k_tiles
from diffuserve.model.quant.scheme import INT4_GROUP_SIZES

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()
HALF = (torch.bfloat16, torch.float16)


class Kernel(Protocol):
    name: str

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]: ...

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor: ...


class DequantKernel:
    name = "dequant"

    def prepare(self, fmt: QuantFormat, parts: QuantParts) -> dict[str, torch.Tensor]:
        tensors = {"qdata": parts.qdata, "scale": parts.scale}
        return tensors if parts.zero is None else {**tensors, "zero": parts.zero}

    def matmul(self, x: torch.Tensor, fmt: QuantFormat, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return dequant_matmul(x, fmt, QuantParts(tensors["qdata"], tensors["scale"], tensors.get("zero")))


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


def _cpu_kernel(fmt: QuantFormat, n: int, dtype: torch.dtype) -> Kernel | None:
    if dtype not in HALF:
        return None
    if fmt.method == "int8" and fmt.group_size is None and fmt.row_block == 1:
        return Int8PackKernel(dtype)
    if fmt.method == "int4" and fmt.group_size in INT4_GROUP_SIZES and n % 16 == 0:
        return Int4PackCpuKernel(dtype)
    return None


def _cuda_kernel(fmt: QuantFormat, n: int, k: int, device: torch.device, dtype: torch.dtype) -> Kernel | None:
    capability = torch.cuda.get_device_capability(device)
    per_channel = fmt.group_size is None and fmt.row_block == 1
    if fmt.method == "fp8" and per_channel and capability >= (8, 9) and dtype in HALF and n % 16 == k % 16 == 0:
        return ScaledMmFp8Kernel(dtype, rowwise=capability >= (9, 0))
    tiles = inner_k_tiles(k)
    if fmt.method == "int4" and fmt.group_size in INT4_GROUP_SIZES and dtype == torch.bfloat16 and tiles:
        return TinyGemmInt4Kernel(dtype, tiles) if n % 8 == 0 else None
    return None


def select_kernel(fmt: QuantFormat, n: int, k: int, device: torch.device, dtype: torch.dtype) -> Kernel:
    """The kernel for one weight matrix [N, K] in `fmt` on `device` with activations in `dtype`."""
    kernel = _cuda_kernel(fmt, n, k, device, dtype) if device.type == "cuda" else _cpu_kernel(fmt, n, dtype)
    if kernel is not None:
        return kernel
    if fmt.method == "fp8":
        where = "this GPU (fp8 matmuls need sm89+, per-channel scales)" if device.type == "cuda" else "the CPU"
        _log_once(f"fp8 weights ({fmt.describe()}): no fp8 matmul on {where}; dequantizing them inside each matmul")
    return DequantKernel()
