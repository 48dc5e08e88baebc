"""Microbenchmarks of this machine, run in the same process as the benchmark they calibrate: the matmul rate
(a large square GEMM in the model's dtype) and the memory bandwidth (a streaming read of a buffer far larger
than the caches). They are what "efficiency" is measured against, so they use the same device, dtype and
thread count as the engine. Knows nothing of models.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MachineRates:
    flops_per_s: float
    """Achieved FLOP/s of an n x n x n matmul."""
    matmul_size: int
    bandwidth_bytes_per_s: float
    """Achieved read bandwidth of a sum over a large buffer."""
    bandwidth_buffer_bytes: int
    dtype: str

    def to_json(self) -> dict:
        return {
            "matmul_flops_per_s": self.flops_per_s,
            "matmul_size": self.matmul_size,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_buffer_bytes": self.bandwidth_buffer_bytes,
            "dtype": self.dtype,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_rate(work: float, fn: Callable[[], object], device: torch.device, seconds: float) -> float:
    """work / median time of repeated calls within about `seconds` (at least five timed calls). The median,
    not the best, so that on a shared machine the probe sees the same contention as the engine beside it."""
    fn()  # warm-up: first-call allocation and kernel selection
    _sync(device)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return work / statistics.median(times)


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int, seconds: float = 1.0) -> float:
    """FLOP/s of a size^3 GEMM (2 * size^3 FLOPs per call)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    return _median_rate(2.0 * size**3, lambda: torch.mm(a, b), device, seconds)


def read_bandwidth(device: torch.device, num_bytes: int, seconds: float = 1.0) -> float:
    """Bytes/s of summing a float32 buffer of `num_bytes` (read once per call)."""
    buffer = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    return _median_rate(float(buffer.numel() * 4), buffer.sum, device, seconds)


def mean_rates(a: MachineRates, b: MachineRates) -> MachineRates:
    """The mean of two probe runs (before and after a measurement)."""
    return MachineRates(
        (a.flops_per_s + b.flops_per_s) / 2,
        a.matmul_size,
        (a.bandwidth_bytes_per_s + b.bandwidth_bytes_per_s) / 2,
        a.bandwidth_buffer_bytes,
        a.dtype,
    )


def measure_machine(
    device: torch.device,
    dtype: torch.dtype,
    matmul_size: int | None = None,
    buffer_bytes: int | None = None,
    seconds: float = 1.0,
) -> MachineRates:
    """Both probes. Defaults: a 1024 GEMM and a 256 MiB buffer on CPU; 8192 and 2 GiB on GPU."""
    is_gpu = device.type == "cuda"
    size = matmul_size or (8192 if is_gpu else 1024)
    num_bytes = buffer_bytes or ((2 << 30) if is_gpu else (256 << 20))
    return MachineRates(
        flops_per_s=matmul_rate(device, dtype, size, seconds),
        matmul_size=size,
        bandwidth_bytes_per_s=read_bandwidth(device, num_bytes, seconds),
        bandwidth_buffer_bytes=num_bytes,
        dtype=str(dtype).removeprefix("torch."),
    )
