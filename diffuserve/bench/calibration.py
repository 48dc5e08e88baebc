"""The `"calibration"` object of a bench run's JSON line: what `diffuserve plan --calibrate` reads. Its schema is
the planner's `Calibration` class (diffuserve/planner/calibration_record.py; docs/planning/calibration.md): this
module fills one in and writes it with `to_json`, the planner reads it back with `from_json`.

Owns the fit of the two engine knobs the planner's roofline needs besides the machine's rates:
    t_step = step_overhead_s + max(bytes / bandwidth, FLOPs / (matmul rate x achieved_flops_fraction))
fitted (least relative squares) on the decode steps of runs *other than* the one whose throughput the planner
is asked to predict, so the predicted-vs-measured error is a real test. The bandwidth and matmul rate are this
machine's, measured in the same process (probes.py), so achieved_bandwidth_fraction is 1 by definition and
achieved_flops_fraction is how much of the probe's rate the model's own forwards reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diffuserve.bench.engine_run import StepRecord
from diffuserve.bench.flops import ModelCost
from diffuserve.bench.probes import MachineRates
from diffuserve.planner.calibration_record import Calibration

PLANNER_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class StepSample:
    flops: float
    bytes: float
    seconds: float


@dataclass(frozen=True)
class FittedEfficiency:
    flops_fraction: float
    step_overhead_s: float
    num_samples: int
    rms_relative_error: float
    """Of the fit on its own samples."""


def step_samples(steps: Sequence[StepRecord], cost: ModelCost, experts_touched_per_layer: float) -> list[StepSample]:
    """Decode steps (no prompt tokens) as (FLOPs, bytes, wall seconds)."""
    return [
        StepSample(
            cost.step_flops(s.num_tokens, s.num_logit_rows, s.attention_pairs),
            cost.step_bytes(experts_touched_per_layer, s.kv_tokens_read, s.num_seqs),
            s.wall_s,
        )
        for s in steps
        if s.prefill_tokens == 0
    ]


def _fit_overhead(samples: Sequence[StepSample], rates: MachineRates, fraction: float) -> tuple[float, float]:
    """For a given FLOPs fraction: the overhead minimising relative squared error (closed form, clipped at 0)
    and that error (RMS)."""
    bound = [max(s.bytes / rates.bandwidth_bytes_per_s, s.flops / (rates.flops_per_s * fraction)) for s in samples]
    weights = [1 / s.seconds**2 for s in samples]
    overhead = max(0.0, sum(w * (s.seconds - b) for w, s, b in zip(weights, samples, bound)) / sum(weights))
    error = sum(((overhead + b - s.seconds) / s.seconds) ** 2 for s, b in zip(samples, bound)) / len(samples)
    return overhead, error**0.5


def fit_efficiency(samples: Sequence[StepSample], rates: MachineRates) -> FittedEfficiency:
    """Grid search over the FLOPs fraction (0.01 .. 1 in steps of 0.005), overhead in closed form."""
    if not samples:
        raise ValueError("calibration: no decode steps to fit the step overhead and FLOPs fraction on")
    best = min(((_fit_overhead(samples, rates, f / 200), f / 200) for f in range(2, 201)), key=lambda r: r[0][1])
    (overhead, error), fraction = best
    return FittedEfficiency(fraction, overhead, len(samples), error)


def calibration_object(
    model_config: dict[str, Any],
    dtype: str,
    rates: MachineRates,
    memory_bytes: int,
    workload: dict[str, int],
    fitted: FittedEfficiency,
    tpf: float,
    experts_touched_per_block: float | None,
    measured_decode_tokens_per_s: float,
    measured_forward_time_s: float,
    deployment: dict[str, int],
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> dict[str, Any]:
    """The object under the JSON line's "calibration" key (schema_version 1). `quantization`: the weights'
    format when quantized on load (then the planner's weight dtype); the K/V are in `dtype` unless
    `kv_cache_dtype` is fp8."""
    planner_dtype = PLANNER_DTYPES.get(dtype)
    if planner_dtype is None:
        raise ValueError(f"dtype: {dtype} has no planner spelling; use one of {', '.join(PLANNER_DTYPES)}")
    return Calibration(
        model_config=model_config,
        weight_dtype=quantization or planner_dtype,
        kv_dtype="fp8" if kv_cache_dtype == "fp8" else planner_dtype,
        hardware_memory_bytes=memory_bytes,
        hardware_bandwidth_bytes_per_s=rates.bandwidth_bytes_per_s,
        hardware_flops_per_s=rates.flops_per_s,
        num_seqs=workload["num_seqs"],
        prompt_tokens=workload["prompt_tokens"],
        output_tokens=workload["output_tokens"],
        block_length=workload["block_length"],
        # The bandwidth is this machine's own probe, so the achieved fraction is 1 by definition (see above).
        achieved_bandwidth_fraction=1.0,
        achieved_flops_fraction=fitted.flops_fraction,
        step_overhead_s=fitted.step_overhead_s,
        tpf=tpf,
        experts_touched_per_block=experts_touched_per_block,
        measured_decode_tokens_per_s=measured_decode_tokens_per_s,
        measured_forward_time_s=measured_forward_time_s,
        deployment_fields=deployment,
        fit={"num_decode_steps": fitted.num_samples, "rms_relative_error": fitted.rms_relative_error},
    ).to_json()
