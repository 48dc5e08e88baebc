"""Accelerator (and CPU host) presets: memory, bandwidth, dense FLOP/s, interconnect, power and price.

Owns the numbers the roofline and cost models read about a device, and nothing about models or workloads.
All FLOP/s are **dense** (vendors quote sparse tensor-core figures; those are halved here, the common 2x error
in sizing tools). Memory is what the driver reports (nvidia-smi / rocm-smi), not the marketing figure.
Numbers are from the vendors' datasheets as remembered and re-derived here; the ones marked "assumed" (host
power share, CPU host, prices) are illustrative defaults to override with the CLI flags, not sourced facts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffuserve.planner.units import TERA, MiB


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_bytes: int
    """Physical memory of one device as the driver reports it."""
    bandwidth_bytes_per_s: float
    """Peak memory bandwidth of one device."""
    bf16_flops_per_s: float
    """Dense BF16/FP16 tensor throughput with FP32 accumulation."""
    fp32_flops_per_s: float
    """Dense FP32 matmul throughput (TF32 tensor cores where the device has them)."""
    fp8_flops_per_s: float | None
    """Dense FP8 throughput; None when the device has no FP8 tensor cores (FP8 weights are then upcast)."""
    interconnect_bytes_per_s: float
    """Device-to-device bandwidth per direction (NVLink, xGMI, PCIe or the host network)."""
    power_watts: float
    """Board power (TDP) of one device."""
    cloud_price_per_hour: float
    """Rental price of one device-hour (illustrative; pass --gpu-hour-price)."""
    capex_per_device: float
    """Purchase price of one device including its share of server and network (illustrative; --capex-per-gpu)."""
    runtime_overhead_bytes: int
    """Memory the runtime holds outside weights, KV and activations (CUDA context, allocator slack, graphs)."""
    source: str

    def flops_for(self, weight_dtype: str) -> float:
        """Peak matmul FLOP/s for a weight dtype: FP8 GEMMs on FP8 hardware, FP32 for FP32 models, else BF16
        (int8/int4 weights are weight-only quantization: dequantized to BF16 before the GEMM)."""
        if weight_dtype == "fp8" and self.fp8_flops_per_s:
            return self.fp8_flops_per_s
        if weight_dtype == "fp32":
            return self.fp32_flops_per_s
        return self.bf16_flops_per_s

    def with_overrides(self, **changes: float | int | None) -> HardwareSpec:
        """A copy with the given fields replaced (None values are ignored); the name gains '(custom)'."""
        changes = {key: value for key, value in changes.items() if value is not None}
        if not changes:
            return self
        # mypy checks **changes against every field's type (name: str too); only numeric fields are passed
        return replace(self, name=f"{self.name} (custom)", **changes)  # type: ignore[arg-type]


def _gpu(
    name: str,
    mem_mib: int,
    tb_s: float,
    bf16_tf: float,
    fp32_tf: float,
    fp8_tf: float | None,
    link_gb_s: float,
    watts: float,
    price: float,
    capex: float,
    source: str,
) -> HardwareSpec:
    return HardwareSpec(
        name=name,
        memory_bytes=mem_mib * MiB,
        bandwidth_bytes_per_s=tb_s * TERA,
        bf16_flops_per_s=bf16_tf * TERA,
        fp32_flops_per_s=fp32_tf * TERA,
        fp8_flops_per_s=None if fp8_tf is None else fp8_tf * TERA,
        interconnect_bytes_per_s=link_gb_s * 1e9,
        power_watts=watts,
        cloud_price_per_hour=price,
        capex_per_device=capex,
        runtime_overhead_bytes=1536 * MiB,
        source=source,
    )


# Memory in MiB as reported by the driver; bandwidth TB/s; dense TFLOP/s (bf16, fp32/tf32, fp8); link GB/s per
# direction; board watts; $/device-hour; $ capex per device incl. its server share.
# H100 $4.25/h and A100 $2.21/h are the CoreWeave list prices of Feb 2024 tabulated by microsoft/vidur
# (vidur/config_optimizer/analyzer/constants.py); every other price and capex figure is an assumption.
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        _gpu(
            "H200",
            143_771,
            4.8,
            989.4,
            494.7,
            1978.9,
            450,
            700,
            3.50,
            35_000,
            "NVIDIA H200 SXM datasheet (141 GB HBM3e, 4.8 TB/s, 1979/3958 TFLOPS BF16/FP8 sparse)",
        ),
        _gpu(
            "H100-SXM",
            81_559,
            3.35,
            989.4,
            494.7,
            1978.9,
            450,
            700,
            4.25,
            28_000,
            "NVIDIA H100 SXM5 datasheet (80 GB HBM3, 3.35 TB/s)",
        ),
        _gpu(
            "A100-80G",
            81_920,
            2.039,
            312,
            156,
            None,
            300,
            400,
            2.21,
            15_000,
            "NVIDIA A100 SXM4 80GB datasheet (2.039 TB/s, 312 TFLOPS BF16 dense, no FP8)",
        ),
        _gpu(
            "A100-40G",
            40_960,
            1.555,
            312,
            156,
            None,
            300,
            400,
            1.50,
            10_000,
            "NVIDIA A100 SXM4 40GB datasheet (1.555 TB/s)",
        ),
        _gpu(
            "L40S",
            46_068,
            0.864,
            362,
            183,
            733,
            32,
            350,
            1.00,
            10_000,
            "NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, 733/1466 TFLOPS BF16/FP8 sparse), PCIe 4.0",
        ),
        _gpu(
            "RTX-4090",
            24_564,
            1.008,
            165.2,
            82.6,
            330.3,
            32,
            450,
            0.40,
            3_000,
            "NVIDIA Ada whitepaper, RTX 4090 (FP32-accumulate tensor rates), PCIe 4.0",
        ),
        _gpu(
            "RTX-5090",
            32_607,
            1.792,
            209.5,
            104.8,
            419,
            64,
            575,
            0.70,
            3_500,
            "NVIDIA Blackwell RTX whitepaper, RTX 5090 (FP32-accumulate tensor rates), PCIe 5.0",
        ),
        _gpu(
            "RTX-PRO-6000",
            97_887,
            1.792,
            500,
            250,
            1000,
            64,
            600,
            1.50,
            11_000,
            "NVIDIA RTX PRO 6000 Blackwell (96 GB GDDR7, 1792 GB/s, 4000 FP4 TOPS sparse; BF16/FP8 derived "
            "by halving per precision step, unverified)",
        ),
        _gpu(
            "MI300X",
            196_592,
            5.3,
            1307.4,
            163.4,
            2614.9,
            448,
            750,
            2.50,
            20_000,
            "AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s); 7 xGMI links x 64 GB/s",
        ),
        HardwareSpec(
            name="CPU-host",
            memory_bytes=512 * 1024 * MiB,
            bandwidth_bytes_per_s=0.4608 * TERA,
            bf16_flops_per_s=8 * TERA,
            fp32_flops_per_s=4 * TERA,
            fp8_flops_per_s=None,
            interconnect_bytes_per_s=25e9,
            power_watts=500,
            cloud_price_per_hour=1.50,
            capex_per_device=15_000,
            runtime_overhead_bytes=512 * MiB,
            source="assumed one-socket server: 12 x DDR5-4800 channels (460.8 GB/s), 512 GiB, AVX-512 class "
            "compute; pass --memory-gib/--bandwidth-tbps/--tflops for your host",
        ),
    )
}


def get_hardware(name: str) -> HardwareSpec:
    """Preset by name, case- and punctuation-insensitive ('h100_sxm', 'rtx 4090')."""
    wanted = _key(name)
    for preset_name, spec in HARDWARE_PRESETS.items():
        if _key(preset_name) == wanted:
            return spec
    raise ValueError(
        f"hardware: unknown preset {name!r}; presets: {', '.join(HARDWARE_PRESETS)} "
        "(or describe your device with --memory-gib, --bandwidth-tbps and --tflops)"
    )


def custom_hardware(memory_bytes: int, bandwidth_bytes_per_s: float, flops_per_s: float) -> HardwareSpec:
    """A device known only by memory, bandwidth and one dense FLOP/s figure (used for every dtype)."""
    for field_name, value in (("memory", memory_bytes), ("bandwidth", bandwidth_bytes_per_s), ("flops", flops_per_s)):
        if value <= 0:
            raise ValueError(f"hardware: {field_name} must be > 0, got {value}")
    return HardwareSpec(
        name="custom",
        memory_bytes=int(memory_bytes),
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        bf16_flops_per_s=flops_per_s,
        fp32_flops_per_s=flops_per_s,
        fp8_flops_per_s=None,
        interconnect_bytes_per_s=32e9,
        power_watts=500,
        cloud_price_per_hour=1.0,
        capex_per_device=10_000,
        runtime_overhead_bytes=1024 * MiB,
        source="custom (given on the command line or by a calibration file)",
    )


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum()).replace("sxm", "")
