"""`diffuserve plan`: flags -> `PlanOptions` -> Plan (planner/build.py) -> text, `--explain`, `--json`, `--chart`.

Owns flag names (vLLM spellings where one exists); the options and their precedence are the planner's. Knows no
formulas. Imports no torch, so `diffuserve plan` runs on any laptop.
"""

from __future__ import annotations

import argparse
import json

from diffuserve.planner.build import build_plan
from diffuserve.planner.chart import write_chart
from diffuserve.planner.hardware import HARDWARE_PRESETS
from diffuserve.planner.inputs import DECODERS, KV_BYTES, WEIGHT_BYTES, Efficiency
from diffuserve.planner.model_presets import MODEL_PRESETS, load_model
from diffuserve.planner.options import DEFAULT_HARDWARE, DEFAULT_OUTPUT_TOKENS, DEFAULT_TPF, PlanOptions
from diffuserve.planner.params import count_parameters
from diffuserve.planner.report import plan_to_dict, render_text
from diffuserve.planner.units import TERA, fmt_bytes, fmt_count, fmt_rate


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
    plan = build_plan(PlanOptions.from_flags(args))
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
    group.add_argument("--tensor-parallel-size", "-tp", type=int, default=PlanOptions.tensor_parallel_size)
    group.add_argument("--expert-parallel-size", "-ep", type=int, default=PlanOptions.expert_parallel_size)
    group.add_argument("--weight-dtype", "--quantization", choices=list(WEIGHT_BYTES), help="default bf16")
    group.add_argument("--kv-cache-dtype", choices=["auto", *KV_BYTES], default=PlanOptions.kv_cache_dtype)
    group.add_argument("--gpu-memory-utilization", type=float, default=PlanOptions.gpu_memory_utilization)
    group.add_argument("--max-num-seqs", type=int, default=PlanOptions.max_num_seqs)
    group.add_argument("--max-num-batched-tokens", type=int, default=PlanOptions.max_num_batched_tokens)
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
        "--decoder",
        choices=list(DECODERS),
        default=PlanOptions.decoder,
        help="diffusion (TPF: --tpf), or verified: drafts checked against the causal path, TPF from "
        "--verified-tpf, else --acceptance-rate, else the measured value; a GDN model holds one more copy of its "
        "state per sequence",
    )
    group.add_argument(
        "--verified-tpf", type=float, help="verified decoding's output tokens per forward (bench compare's TPF)"
    )
    group.add_argument(
        "--acceptance-rate",
        type=float,
        help="verified decoding: share of drafted tokens the causal check keeps, 0..1; TPF from it and --tpf",
    )
    group.add_argument(
        "--block-expert-coreset",
        default=PlanOptions.block_expert_coreset,
        metavar="RULE",
        help="the block expert coreset rule: C routes each denoised block's positions to at most C experts per MoE "
        "layer (0: off), cumulative:0.6[,min=16,window=32] is dMoE's rule (docs/models/coreset.md); also shows batch 1 "
        "with and without it (default: the model's config.json, else off)",
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
    group.add_argument("--years", type=float, default=PlanOptions.years, help="amortization years")
    group.add_argument("--power-watts", type=float, help="wall watts per device incl. host share")
    group.add_argument("--pue", type=float, default=PlanOptions.pue)
    group.add_argument("--electricity-price", type=float, default=PlanOptions.electricity_price, help="$ per kWh")
    group.add_argument(
        "--utilization",
        type=float,
        default=PlanOptions.utilization,
        help="fraction of hours serving at the planned throughput",
    )
