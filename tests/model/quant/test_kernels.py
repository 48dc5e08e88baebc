"""Every quantized matmul against the plain dequantize-then-matmul reference (reference/reference_quant.py: float64,
no code shared with the kernels) on random parts of the same quantized weights, in fp32 activations: equal within
1e-4 relative. The CUDA adapters run here through torch's CPU `_scaled_mm` (the same documented contract) and an
emulation of tinygemm's contract (its ops are CUDA-only)."""

from __future__ import annotations

import logging

import pytest
import torch

from diffuserve.model.quant import kernels
from diffuserve.model.quant.dequant_kernel import dequant_matmul
from diffuserve.model.quant.formats import FP8_MAX, QuantFormat, QuantParts, Region
from diffuserve.model.quant.kernels import DequantKernel, select_kernel
from diffuserve.model.quant.kernels_cpu import Int4PackCpuKernel, Int8PackKernel
from diffuserve.model.quant.kernels_cuda import ScaledMmFp8Kernel, TinyGemmInt4Kernel
from diffuserve.reference.reference_quant import reference_dequantize, reference_linear

TOLERANCE = 1e-4


def random_parts(fmt: QuantFormat, n: int, k: int, seed: int = 0) -> QuantParts:
    """Random values, positive scales and (asymmetric) integer zero points of one [N, K] matrix."""
    g = torch.Generator().manual_seed(seed)
    groups = 1 if fmt.group_size is None else -(-k // fmt.group_size)
    scale = torch.rand(-(-n // fmt.row_block), groups, generator=g) * 0.05 + 0.01
    zero = None
    if fmt.method == "int8":
        qdata = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    elif fmt.method == "int4":
        qdata = torch.randint(0, 256, (n, k // 2), generator=g).to(torch.uint8)
        zero = None if fmt.symmetric else torch.randint(0, 16, (n, groups), generator=g).float()
    else:
        qdata = (torch.randn(n, k, generator=g) * 100).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantParts(qdata, scale, zero)


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.double() - expected).abs().max() / expected.abs().max()).item()


def run_kernel(kernel, fmt: QuantFormat, parts: QuantParts, x: torch.Tensor) -> torch.Tensor:
    return kernel.matmul(x, fmt, kernel.prepare(fmt, parts))


DEQUANT_CASES = [
    (QuantFormat("int8"), 48, 64),
    (QuantFormat("int4", 32, symmetric=False), 48, 96),
    (QuantFormat("int4", 64), 32, 128),
    (QuantFormat("int4", None, symmetric=False), 16, 40),
    (QuantFormat("fp8"), 40, 64),
    (QuantFormat("fp8", 16, 16), 600, 520),  # 128 x 128-style blocks, partial last block, several slabs
]


@pytest.mark.parametrize(("fmt", "n", "k"), DEQUANT_CASES, ids=lambda v: getattr(v, "describe", lambda: v)())
def test_dequantizing_matmul_equals_the_reference(fmt, n, k):
    parts = random_parts(fmt, n, k)
    x = torch.randn(7, k)
    assert relative_error(run_kernel(DequantKernel(), fmt, parts, x), reference_linear(x, fmt, parts)) < TOLERANCE


def test_the_reference_is_the_documented_formula_by_hand():
    """int4, group 2: byte 0x3A holds columns (10, 3); zero 1, scale 0.5 -> (10 - 1) * 0.5, (3 - 1) * 0.5."""
    fmt = QuantFormat("int4", 2, symmetric=False)
    parts = QuantParts(torch.tensor([[0x3A]], dtype=torch.uint8), torch.tensor([[0.5]]), torch.tensor([[1.0]]))
    assert reference_dequantize(fmt, parts).tolist() == [[4.5, 1.0]]
    assert dequant_matmul(torch.eye(2), fmt, parts).T.tolist() == [[4.5, 1.0]]


@pytest.mark.parametrize("n", [32, 48])
def test_int8pack_equals_the_reference(n):
    fmt = QuantFormat("int8")
    parts = random_parts(fmt, n, 64, seed=1)
    x = torch.randn(5, 64)
    out = run_kernel(Int8PackKernel(torch.float32), fmt, parts, x)
    assert relative_error(out, reference_linear(x, fmt, parts)) < TOLERANCE


@pytest.mark.parametrize(("group", "symmetric"), [(32, False), (128, False), (64, True)])
def test_int4pack_cpu_equals_the_reference(group, symmetric):
    fmt = QuantFormat("int4", group, symmetric=symmetric)
    parts = random_parts(fmt, 48, 256, seed=2)
    x = torch.randn(9, 256)
    out = run_kernel(Int4PackCpuKernel(torch.float32), fmt, parts, x)
    assert relative_error(out, reference_linear(x, fmt, parts)) < TOLERANCE


def _fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    """The activations _scaled_mm sees, dequantized: one scale per row, max |x| -> 448 (written for the test)."""
    scale = x.abs().amax(dim=1, keepdim=True) / FP8_MAX
    return (x / scale).to(torch.float8_e4m3fn).double() * scale.double()


@pytest.mark.parametrize("rowwise", [True, False])
def test_scaled_mm_fp8_adapter_meets_the_documented_contract(rowwise):
    """torch._scaled_mm (CPU implementation of the CUDA op's contract): a [M, K] fp8, b [K, N] column-major,
    fp32 scales [M, 1] and [1, N] (row-wise, sm90), or one activation scale (sm89, weight scales applied after)."""
    fmt = QuantFormat("fp8")
    parts = random_parts(fmt, 32, 64, seed=3)
    x = torch.randn(6, 64)
    if rowwise:
        activations = _fp8_per_token(x)
    else:
        scale = x.abs().max() / FP8_MAX
        activations = (x / scale).to(torch.float8_e4m3fn).double() * scale.double()
    expected = activations @ reference_dequantize(fmt, parts).T
    out = run_kernel(ScaledMmFp8Kernel(torch.float32, rowwise), fmt, parts, x)
    assert relative_error(out, expected) < TOLERANCE


def _emulated_tinygemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygemm's documented contract on the CPU: the packed operand is uint8 [N, K / 2] with column 2c in the
    high nibble; W[n, k] = (nibble - 8) * sz[k // g, n, 0] + sz[k // g, n, 1]."""

    def convert(high_even: torch.Tensor, tiles: int) -> torch.Tensor:
        assert high_even.dtype == torch.uint8 and tiles in (2, 4, 8)
        return high_even.clone()

    def matmul(x: torch.Tensor, packed: torch.Tensor, group: int, sz: torch.Tensor) -> torch.Tensor:
        n, half = packed.shape
        q = torch.empty(n, 2 * half, dtype=torch.float64)
        q[:, 0::2], q[:, 1::2] = (packed.long() // 16).double(), (packed.long() % 16).double()
        g = torch.arange(2 * half) // group
        w = (q - 8) * sz[g, :, 0].T.double() + sz[g, :, 1].T.double()
        return (x.double() @ w.T).to(x.dtype)

    monkeypatch.setattr(torch, "_convert_weight_to_int4pack", convert, raising=False)
    monkeypatch.setattr(torch, "_weight_int4pack_mm", matmul, raising=False)


@pytest.mark.parametrize("symmetric", [False, True])
def test_tinygemm_int4_adapter_meets_the_documented_contract(monkeypatch, symmetric):
    _emulated_tinygemm(monkeypatch)
    fmt = QuantFormat("int4", 64, symmetric=symmetric)
    parts = random_parts(fmt, 24, 128, seed=4)
    x = torch.randn(4, 128)
    out = run_kernel(TinyGemmInt4Kernel(torch.float32, 8), fmt, parts, x)
    assert relative_error(out, reference_linear(x, fmt, parts)) < TOLERANCE


def test_cpu_kernel_choice_and_the_one_line_fp8_fallback(caplog):
    cpu = torch.device("cpu")
    assert select_kernel(QuantFormat("int8"), 64, 64, cpu, torch.bfloat16).name == "int8pack"
    assert select_kernel(QuantFormat("int8"), 64, 64, cpu, torch.float32).name == "dequant"
    assert select_kernel(QuantFormat("int4", 128, symmetric=False), 64, 256, cpu, torch.bfloat16).name == "int4pack-cpu"
    assert select_kernel(QuantFormat("int4", 16), 64, 256, cpu, torch.bfloat16).name == "dequant"  # no such kernel
    assert select_kernel(QuantFormat("int4", 128), 40, 256, cpu, torch.bfloat16).name == "dequant"  # N % 16
    kernels._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        for _ in range(3):
            assert select_kernel(QuantFormat("fp8"), 64, 64, cpu, torch.bfloat16).name == "dequant"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no fp8 matmul on the CPU" in lines[0]


def test_a_quantized_weight_takes_transposed_activations():
    """QuantWeight.linear on x whose rows are not contiguous (the GDN output reaches out_proj transposed)."""
    from diffuserve.model.quant.quantize import quantize
    from diffuserve.model.quant.weight import QuantWeight

    fmt = QuantFormat("int8")
    weight = QuantWeight(fmt, (32, 64), torch.bfloat16, device="cpu")
    parts = quantize(torch.randn(32, 64), fmt, torch.bfloat16)
    weight.write(Region(None, (0, 32), (0, 64)), parts, "w")
    weight.finalize(torch.bfloat16)
    assert weight.kernel is not None and weight.kernel.name == "int8pack"
    x = torch.randn(64, 5).bfloat16().T  # [5, 64], column-major
    expected = reference_linear(x.float(), fmt, parts)
    assert relative_error(weight.linear(x), expected) < 2e-2


def test_bf16_kernels_stay_within_bf16_rounding_of_the_reference():
    """The speed paths in the model dtype: int8pack and int4pack with bf16 activations and scales."""
    x = torch.randn(8, 256).bfloat16()
    for fmt, kernel in (
        (QuantFormat("int8"), Int8PackKernel),
        (QuantFormat("int4", 128, symmetric=False), Int4PackCpuKernel),
    ):
        parts = random_parts(fmt, 64, 256, seed=5)
        parts = QuantParts(parts.qdata, parts.scale.bfloat16(), None if parts.zero is None else parts.zero.bfloat16())
        out = run_kernel(kernel(torch.bfloat16), fmt, parts, x)
        assert relative_error(out, reference_linear(x.float(), fmt, parts)) < 2e-2
