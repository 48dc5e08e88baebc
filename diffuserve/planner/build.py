"""build_plan: frozen `PlanOptions` (what `diffuserve plan`'s flags and the server's POST /plan both give) -> Plan.

Owns the precedence explicit option > calibration > default. Knows no flag spelling and no HTTP shape; imports no
torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from diffuserve.planner.calibrate import Calibration, check_calibration, load_calibration
from diffuserve.planner.coreset import model_config, planned_coreset_size, planned_rule
from diffuserve.planner.hardware import HardwareSpec, custom_hardware, get_hardware
from diffuserve.planner.inputs import KV_BYTES, CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import ModelPreset, load_model
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.options import (
    DEFAULT_HARDWARE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_TPF,
    HOST_POWER_SHARE,
    PlanOptions,
)
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.units import TERA, GiB
from diffuserve.planner.verified import verified_tpf


def build_plan(options: PlanOptions) -> Plan:
    """The plan these options ask for (what `diffuserve plan` prints); ValueError, naming the field, when it cannot
    be made."""
    calibration = load_calibration(options.calibrate) if options.calibrate else None
    spec, preset = _model(options, calibration)
    hardware = _hardware(options, calibration)
    return _plan(options, spec, preset, hardware, calibration)


def _plan(
    options: PlanOptions,
    spec: ModelSpec,
    preset: ModelPreset | None,
    hardware: HardwareSpec,
    calibration: Calibration | None,
) -> Plan:
    weight_dtype = options.weight_dtype or (calibration.weight_dtype if calibration and not options.model else "bf16")
    deployment = Deployment(
        num_gpus=_pick(options.num_gpus, max(options.tensor_parallel_size, options.expert_parallel_size)),
        tensor_parallel_size=options.tensor_parallel_size,
        expert_parallel_size=options.expert_parallel_size,
        weight_dtype=weight_dtype,
        kv_dtype=_kv_dtype(options.kv_cache_dtype, weight_dtype),
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        page_size=options.page_size,
        runtime_overhead_bytes=_gib(options.runtime_overhead_gib),
        activation_bytes=_gib(options.activation_gib),
    )
    plan = make_plan(
        spec,
        hardware,
        deployment,
        _workload(options, spec, preset, calibration),
        _efficiency(options, calibration),
        _cost_inputs(options, hardware),
        preset,
    )
    return replace(plan, calibration=check_calibration(calibration)) if calibration else plan


def _model(options: PlanOptions, calibration: Calibration | None) -> tuple[ModelSpec, ModelPreset | None]:
    if options.model:
        return load_model(options.model)
    if calibration:
        return calibration.spec, None
    raise ValueError("model: give a preset name, a model directory or a config.json path (see --list-presets)")


def _hardware(options: PlanOptions, calibration: Calibration | None) -> HardwareSpec:
    for flag in ("memory_gib", "bandwidth_tbps", "tflops"):
        value = getattr(options, flag)
        if value is not None and value <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}: must be > 0, got {value}")
    custom = {
        "memory_bytes": _gib(options.memory_gib),
        "bandwidth_bytes_per_s": _scaled(options.bandwidth_tbps, TERA),
        "bf16_flops_per_s": _scaled(options.tflops, TERA),
    }
    if options.hardware:
        return get_hardware(options.hardware).with_overrides(**custom)
    memory, bandwidth, flops = custom.values()
    if memory is not None and bandwidth is not None and flops is not None:
        return custom_hardware(int(memory), bandwidth, flops)
    if calibration and not options.model:
        return calibration.hardware.with_overrides(**custom)
    return get_hardware(DEFAULT_HARDWARE).with_overrides(**custom)


def _workload(
    options: PlanOptions, spec: ModelSpec, preset: ModelPreset | None, calibration: Calibration | None
) -> Workload:
    """Flags first; planning the bench's own model defaults to the bench's workload; then generic defaults."""
    bench = calibration if calibration and not options.model else None
    context = _pick(
        options.context_length, bench.prompt_tokens + bench.output_tokens if bench else spec.max_position_embeddings
    )
    output = _pick(options.output_tokens, bench.output_tokens if bench else min(DEFAULT_OUTPUT_TOKENS, context // 2))
    block = _pick(options.block_length, spec.block_length)
    default_tpf = preset.default_tpf if preset and preset.default_tpf else DEFAULT_TPF
    tpf = _pick(options.tpf, calibration.tpf if calibration else min(default_tpf, block))
    tpf, source = _decoding_tpf(options, tpf, block)
    touched = None
    if calibration is not None and (calibration.spec.num_experts, calibration.spec.num_experts_per_tok) == (
        spec.num_experts,
        spec.num_experts_per_tok,
    ):
        touched = calibration.experts_touched_per_block
    return Workload(
        context_length=context,
        prompt_tokens=_pick(options.prompt_tokens, context - output),
        output_tokens=output,
        block_length=block,
        tpf=tpf,
        decoder=options.decoder,
        tpf_source=source,
        concurrency=_pick(options.concurrency, bench.num_seqs if bench else None),
        request_rate=options.request_rate,
        experts_touched_fraction=options.experts_touched_fraction,
        experts_touched_per_block=touched,
        **_coreset(options, spec, preset, block, touched),
    )


def _coreset(
    options: PlanOptions, spec: ModelSpec, preset: ModelPreset | None, block: int, touched: float | None
) -> dict[str, Any]:
    """The Workload's coreset fields: the rule's C (the cumulative rule's estimated mean) and its text."""
    config = preset.config if preset else (model_config(options.model) if options.model else None)
    rule = planned_rule(options.block_expert_coreset, config)
    if rule is None or not spec.is_moe:
        return {}
    size = planned_coreset_size(spec, rule, block, touched)
    return {"block_expert_coreset": size, "coreset_rule": rule.describe() if rule.every_window else ""}


def _decoding_tpf(options: PlanOptions, tpf: float, block: int) -> tuple[float, str]:
    """(TPF, its source) under the planned decoder: the diffusion TPF as it is, or verified decoding's from it."""
    if options.decoder == "verified":
        return verified_tpf(options.verified_tpf, options.acceptance_rate, block)
    for flag in ("verified_tpf", "acceptance_rate"):
        if getattr(options, flag) is not None:
            name = flag.replace("_", "-")
            raise ValueError(f"--{name}: plans verified decoding only; add --decoder verified, or drop --{name}")
    return tpf, ""


def _efficiency(options: PlanOptions, calibration: Calibration | None) -> Efficiency:
    base = calibration.efficiency if calibration else Efficiency()
    overhead = None if options.step_overhead_ms is None else options.step_overhead_ms / 1000
    return Efficiency(
        bandwidth_fraction=_pick(options.bandwidth_fraction, base.bandwidth_fraction),
        flops_fraction=_pick(options.flops_fraction, base.flops_fraction),
        step_overhead_s=_pick(overhead, base.step_overhead_s),
    )


def _cost_inputs(options: PlanOptions, hardware: HardwareSpec) -> CostInputs:
    return CostInputs(
        gpu_hour_price=_pick(options.gpu_hour_price, hardware.cloud_price_per_hour),
        capex_per_gpu=_pick(options.capex_per_gpu, hardware.capex_per_device),
        amortization_years=options.years,
        power_watts_per_gpu=_pick(options.power_watts, hardware.power_watts * (1 + HOST_POWER_SHARE)),
        pue=options.pue,
        electricity_price_per_kwh=options.electricity_price,
        utilization=options.utilization,
    )


def _kv_dtype(flag: str, weight_dtype: str) -> str:
    if flag != "auto":
        return flag
    return weight_dtype if weight_dtype in KV_BYTES else "bf16"


def _pick(value: Any, default: Any) -> Any:
    """The flag's value when given (even 0, which validation then rejects), else the default."""
    return default if value is None else value


def _gib(value: float | None) -> int | None:
    return None if value is None else int(value * GiB)


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value * unit
