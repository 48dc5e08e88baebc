"""`diffuserve plan`: flags -> planner inputs -> Plan -> text, `--explain`, `--json`, `--chart`.

Owns flag names (vLLM spellings where one exists) and the precedence explicit flag > calibration > default.
Knows no formulas. Imports no torch, so `diffuserve plan` runs on any laptop.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from diffuserve.planner.calibrate import Calibration, check_calibration, load_calibration
from diffuserve.planner.chart import write_chart
from diffuserve.planner.hardware import HARDWARE_PRESETS, HardwareSpec, custom_hardware, get_hardware
from diffuserve.planner.inputs import KV_BYTES, WEIGHT_BYTES, CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import MODEL_PRESETS, ModelPreset, load_model
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.params import count_parameters
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.report import plan_to_dict, render_text
from diffuserve.planner.units import TERA, GiB, fmt_bytes, fmt_count, fmt_rate

DEFAULT_HARDWARE = "H200"
DEFAULT_TPF = 2.5
DEFAULT_OUTPUT_TOKENS = 1024
HOST_POWER_SHARE = 0.4
"""Assumed host (CPU, memory, NIC, fans) power on top of each device's board power."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="preset name (see --list-presets), model directory or config.json")
    parser.add_argument("--list-presets", action="store_true", help="list model and hardware presets and exit")
    _add_hardware_arguments(parser.add_argument_group("hardware"))
    _add_deployment_arguments(parser.add_argument_group("deployment"))
    _add_workload_arguments(parser.add_argument_group("workload"))
    _add_efficiency_arguments(parser.add_argument_group("efficiency (defaults, or from --calibrate)"))
    _add_cost_arguments(parser.add_argument_group("cost"))
    out = parser.add_argument_group("output")
    out.add_argument("--calibrate", metavar="BENCH.json", help="use what `diffuserve bench` measured")
    out.add_argument("--explain", action="store_true", help="print every formula with its numbers")
    out.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    out.add_argument("--chart", metavar="PATH", help="write a PNG of throughput and cost vs concurrency")


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        print("\n".join(_preset_lines()))
        return 0
    plan = build_plan(args)
    if args.json:
        document = plan_to_dict(plan)
        if args.explain:
            document["explain"] = plan.explain()
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(render_text(plan) + (["", *plan.explain()] if args.explain else [])))
    if args.chart:
        print(f"chart written to {write_chart(plan, args.chart)}")
    return 0


def default_args() -> argparse.Namespace:
    """The flags of `diffuserve plan` with none given: every default, as the command line has them."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([])


def build_plan(args: argparse.Namespace) -> Plan:
    """The plan these flags ask for (what `run` prints); ValueError, naming the field, when it cannot be made."""
    calibration = load_calibration(args.calibrate) if args.calibrate else None
    spec, preset = _model(args, calibration)
    hardware = _hardware(args, calibration)
    return _plan(args, spec, preset, hardware, calibration)


def _plan(
    args: argparse.Namespace,
    spec: ModelSpec,
    preset: ModelPreset | None,
    hardware: HardwareSpec,
    calibration: Calibration | None,
) -> Plan:
    weight_dtype = args.weight_dtype or (calibration.weight_dtype if calibration and not args.model else "bf16")
    deployment = Deployment(
        num_gpus=_pick(args.num_gpus, max(args.tensor_parallel_size, args.expert_parallel_size)),
        tensor_parallel_size=args.tensor_parallel_size,
        expert_parallel_size=args.expert_parallel_size,
        weight_dtype=weight_dtype,
        kv_dtype=_kv_dtype(args.kv_cache_dtype, weight_dtype),
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        page_size=args.page_size,
        runtime_overhead_bytes=_gib(args.runtime_overhead_gib),
        activation_bytes=_gib(args.activation_gib),
    )
    plan = make_plan(
        spec,
        hardware,
        deployment,
        _workload(args, spec, preset, calibration),
        _efficiency(args, calibration),
        _cost_inputs(args, hardware),
        preset,
    )
    return replace(plan, calibration=check_calibration(calibration)) if calibration else plan


def _model(args: argparse.Namespace, calibration: Calibration | None) -> tuple[ModelSpec, ModelPreset | None]:
    if args.model:
        return load_model(args.model)
    if calibration:
        return calibration.spec, None
    raise ValueError("model: give a preset name, a model directory or a config.json path (see --list-presets)")


def _hardware(args: argparse.Namespace, calibration: Calibration | None) -> HardwareSpec:
    for flag in ("memory_gib", "bandwidth_tbps", "tflops"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}: must be > 0, got {value}")
    custom = {
        "memory_bytes": _gib(args.memory_gib),
        "bandwidth_bytes_per_s": _scaled(args.bandwidth_tbps, TERA),
        "bf16_flops_per_s": _scaled(args.tflops, TERA),
    }
    if args.hardware:
        return get_hardware(args.hardware).with_overrides(**custom)
    memory, bandwidth, flops = custom.values()
    if memory is not None and bandwidth is not None and flops is not None:
        return custom_hardware(int(memory), bandwidth, flops)
    if calibration and not args.model:
        return calibration.hardware.with_overrides(**custom)
    return get_hardware(DEFAULT_HARDWARE).with_overrides(**custom)


def _workload(
    args: argparse.Namespace, spec: ModelSpec, preset: ModelPreset | None, calibration: Calibration | None
) -> Workload:
    """Flags first; planning the bench's own model defaults to the bench's workload; then generic defaults."""
    bench = calibration if calibration and not args.model else None
    context = _pick(
        args.context_length, bench.prompt_tokens + bench.output_tokens if bench else spec.max_position_embeddings
    )
    output = _pick(args.output_tokens, bench.output_tokens if bench else min(DEFAULT_OUTPUT_TOKENS, context // 2))
    block = _pick(args.block_length, spec.block_length)
    default_tpf = preset.default_tpf if preset and preset.default_tpf else DEFAULT_TPF
    tpf = _pick(args.tpf, calibration.tpf if calibration else min(default_tpf, block))
    touched = None
    if calibration is not None and (calibration.spec.num_experts, calibration.spec.num_experts_per_tok) == (
        spec.num_experts,
        spec.num_experts_per_tok,
    ):
        touched = calibration.experts_touched_per_block
    return Workload(
        context_length=context,
        prompt_tokens=_pick(args.prompt_tokens, context - output),
        output_tokens=output,
        block_length=block,
        tpf=tpf,
        concurrency=_pick(args.concurrency, bench.num_seqs if bench else None),
        request_rate=args.request_rate,
        experts_touched_fraction=args.experts_touched_fraction,
        experts_touched_per_block=touched,
        block_expert_coreset=args.block_expert_coreset,
    )


def _efficiency(args: argparse.Namespace, calibration: Calibration | None) -> Efficiency:
    base = calibration.efficiency if calibration else Efficiency()
    overhead = None if args.step_overhead_ms is None else args.step_overhead_ms / 1000
    return Efficiency(
        bandwidth_fraction=_pick(args.bandwidth_fraction, base.bandwidth_fraction),
        flops_fraction=_pick(args.flops_fraction, base.flops_fraction),
        step_overhead_s=_pick(overhead, base.step_overhead_s),
    )


def _cost_inputs(args: argparse.Namespace, hardware: HardwareSpec) -> CostInputs:
    return CostInputs(
        gpu_hour_price=_pick(args.gpu_hour_price, hardware.cloud_price_per_hour),
        capex_per_gpu=_pick(args.capex_per_gpu, hardware.capex_per_device),
        amortization_years=args.years,
        power_watts_per_gpu=_pick(args.power_watts, hardware.power_watts * (1 + HOST_POWER_SHARE)),
        pue=args.pue,
        electricity_price_per_kwh=args.electricity_price,
        utilization=args.utilization,
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


def _preset_lines() -> list[str]:
    lines = ["Models (computed from config; active includes embeddings + LM head):"]
    for preset in MODEL_PRESETS.values():
        spec, _ = load_model(preset.name)
        params = count_parameters(spec)
        lines.append(
            f"  {preset.name:<24} {fmt_count(params.total):>8} total (published "
            f"{fmt_count(preset.published_total or 0)}), {fmt_count(params.active(spec)):>7} active "
            f"(published {fmt_count(preset.published_active or 0)}), max context "
            f"{spec.max_position_embeddings:,}, block {spec.block_length}"
        )
    lines.append("Hardware (dense FLOP/s; memory as the driver reports it):")
    for hw in HARDWARE_PRESETS.values():
        lines.append(
            f"  {hw.name:<14} {fmt_bytes(hw.memory_bytes):>10} {fmt_rate(hw.bandwidth_bytes_per_s):>10} "
            f"{hw.bf16_flops_per_s / TERA:7.1f} TFLOP/s bf16  ${hw.cloud_price_per_hour:.2f}/h"
        )
    return lines


def _add_hardware_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--hardware", "--gpu", help=f"preset: {', '.join(HARDWARE_PRESETS)} (default {DEFAULT_HARDWARE})"
    )
    group.add_argument("--memory-gib", type=float, help="device memory in GiB (custom device or override)")
    group.add_argument("--bandwidth-tbps", type=float, help="device memory bandwidth in TB/s")
    group.add_argument("--tflops", type=float, help="dense BF16 TFLOP/s of the device")


def _add_deployment_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--num-gpus", type=int, help="devices in total (default: tp x ep as needed)")
    group.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    group.add_argument("--expert-parallel-size", "-ep", type=int, default=1)
    group.add_argument("--weight-dtype", "--quantization", choices=list(WEIGHT_BYTES), help="default bf16")
    group.add_argument("--kv-cache-dtype", choices=["auto", *KV_BYTES], default="auto")
    group.add_argument("--gpu-memory-utilization", type=float, default=Deployment.gpu_memory_utilization)
    group.add_argument("--max-num-seqs", type=int, default=Deployment.max_num_seqs)
    group.add_argument("--max-num-batched-tokens", type=int, default=Deployment.max_num_batched_tokens)
    group.add_argument("--page-size", type=int, help="KV page in tokens (default: engine's choice)")
    group.add_argument("--runtime-overhead-gib", type=float, help="override the runtime's own memory")
    group.add_argument("--activation-gib", type=float, help="override the activation + logits workspace")


def _add_workload_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--context-length", "--max-model-len", type=int, help="default: the model's maximum")
    group.add_argument("--prompt-tokens", type=int, help="default: context - output tokens")
    group.add_argument("--output-tokens", type=int, help=f"default {DEFAULT_OUTPUT_TOKENS}")
    group.add_argument("--concurrency", type=int, help="concurrent sequences (default: as many as fit)")
    group.add_argument("--request-rate", type=float, help="requests/s to size the deployment for")
    group.add_argument("--block-length", type=int, help="diffusion block length (default: the model's)")
    group.add_argument("--tpf", type=float, help=f"tokens committed per forward per sequence (default {DEFAULT_TPF})")
    group.add_argument(
        "--block-expert-coreset",
        type=int,
        default=0,
        metavar="C",
        help="route each block's positions to at most C experts per MoE layer while it is denoised; also shows "
        "batch 1 with and without it (default 0: off)",
    )
    group.add_argument("--experts-touched-fraction", type=float, help="override 1 - (1 - k/E)^T")


def _add_efficiency_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--bandwidth-fraction", type=float, help=f"MBU (default {Efficiency.bandwidth_fraction})")
    group.add_argument("--flops-fraction", type=float, help=f"MFU (default {Efficiency.flops_fraction})")
    group.add_argument(
        "--step-overhead-ms",
        type=float,
        help=f"fixed time per forward (default {Efficiency.step_overhead_s * 1000:g} ms)",
    )


def _add_cost_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--gpu-hour-price", type=float, help="cloud $ per device-hour (default: preset's)")
    group.add_argument("--capex-per-gpu", type=float, help="$ per device incl. server share (default: preset's)")
    group.add_argument("--years", type=float, default=CostInputs.amortization_years, help="amortization years")
    group.add_argument("--power-watts", type=float, help="wall watts per device incl. host share")
    group.add_argument("--pue", type=float, default=CostInputs.pue)
    group.add_argument(
        "--electricity-price", type=float, default=CostInputs.electricity_price_per_kwh, help="$ per kWh"
    )
    group.add_argument(
        "--utilization",
        type=float,
        default=CostInputs.utilization,
        help="fraction of hours serving at the planned throughput",
    )
