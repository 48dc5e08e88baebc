"""`diffuserve bench latency`: the end-to-end latency of one batch of requests (all submitted at once), over
several iterations after warm-up iterations, with per-request TTFT / TPOT / E2E percentiles, throughput, NFE,
TPF, efficiency, MoE figures and the planner calibration (fitted on the warm-up iterations, which run on their
own engine with their own prompts, and checked against the measured ones). With several `--quantization` values
each weight format runs in turn and a last table sets their bytes per forward and decode tokens/s side by side.
Knows nothing of CLI parsing.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from diffuserve.bench.calibration import calibration_object, fit_efficiency, step_samples
from diffuserve.bench.context import (
    BenchContext,
    decoding,
    make_context,
    max_model_len,
    quantization_options,
    sampling_params,
)
from diffuserve.bench.engine_run import RunRecord, run_requests
from diffuserve.bench.environment import load_average, peak_memory_bytes
from diffuserve.bench.flops import with_measured_weights
from diffuserve.bench.probes import MachineRates, mean_rates
from diffuserve.bench.report import Progress, distribution, finish, format_table
from diffuserve.bench.run_metrics import run_summary
from diffuserve.config import SchedulerConfig
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.weight_bytes import weight_bytes
from diffuserve.worker.experts import ExpertStatsSnapshot


def _iterations(
    ctx: BenchContext, ns: argparse.Namespace, block: int, first_prompt: int, count: int, label: str
) -> tuple[list[RunRecord], LLMEngine]:
    """`count` iterations of one batch each on a fresh engine; prompts first_prompt, first_prompt + 1, ..."""
    engine = ctx.engine(block, ns.batch_size, max_model_len(ns.prompt_tokens, ns.output_tokens, block))
    prompts = ctx.prompts(first_prompt + count * ns.batch_size, ns.prompt_tokens)[first_prompt:]
    params = sampling_params(ns, ns.output_tokens)
    progress = Progress(label, count, unit="iterations")
    records = []
    for i in range(count):
        records.append(run_requests(engine, prompts[i * ns.batch_size : (i + 1) * ns.batch_size], params))
        progress.update(i + 1)
    return records, engine


def _merge(records: list[RunRecord]) -> RunRecord:
    merged = RunRecord()
    for r in records:
        merged.steps += r.steps
        merged.outputs += r.outputs
        merged.wall_s += r.wall_s
    return merged


def _calibration(
    ctx: BenchContext,
    ns: argparse.Namespace,
    block: int,
    warm: RunRecord,
    warm_experts: ExpertStatsSnapshot | None,
    summary: dict[str, Any],
) -> dict[str, Any]:
    """Knobs fitted on the warm-up iterations; the measured iterations are what the planner must predict."""
    touched = warm_experts.experts_touched_per_step if warm_experts else 0.0
    fitted = fit_efficiency(step_samples(warm.steps, ctx.cost, touched), ctx.rates)
    experts = summary["experts"]
    calibration = calibration_object(
        ctx.model_config,
        ctx.dtype,
        ctx.rates,
        ctx.environment["hardware"]["memory_bytes"],
        {
            "num_seqs": ns.batch_size,
            "prompt_tokens": ns.prompt_tokens,
            "output_tokens": ns.output_tokens,
            "block_length": block,
        },
        fitted,
        summary["tpf"],
        experts["experts_touched_per_block"] if experts else None,
        summary["decode_tokens_per_s"],
        summary["mean_decode_step_s"],
        {
            "tensor_parallel_size": 1,
            "max_num_seqs": ns.batch_size,
            "max_num_batched_tokens": SchedulerConfig().max_num_batched_tokens,
        },
        ctx.engine_options.get("quantization"),
        ctx.engine_options.get("kv_cache_dtype", "auto"),
    )
    calibration["fit"]["runs"] = [f"{ns.num_iters_warmup} warm-up iteration(s) on their own engine"]
    return calibration


def _table(ns: argparse.Namespace, batch_latency: list[float], summary: dict[str, Any]) -> str:
    latency = summary["latency"]
    return format_table(
        [
            "batch",
            "iters",
            "latency mean s",
            "p50 s",
            "p90 s",
            "p99 s",
            "tok/s",
            "TPF",
            "NFE/req",
            "TTFT p50 s",
            "TPOT p50 ms",
        ],
        [
            [
                ns.batch_size,
                ns.num_iters,
                *(distribution(batch_latency)[k] for k in ("mean", "p50", "p90", "p99")),
                summary["tokens_per_s"],
                summary["tpf"],
                summary["nfe_per_request"],
                latency["ttft_s"]["p50"],
                1000 * (latency["tpot_s"]["p50"] or 0.0),
            ]
        ],
    )


def gdn_line(gdn: dict[str, float], rates: MachineRates) -> str:
    share, ms = 100 * gdn["gdn_share_of_step"], {k: 1000 * v for k, v in gdn.items() if k.endswith("_s_per_step")}
    return (
        f"GDN layers: {ms['gdn_s_per_step']:.2f} ms per decode step ({share:.0f}% of the step); floor "
        f"{ms['gdn_floor_s_per_step']:.2f} ms, the larger of {gdn['gdn_bytes_per_step'] / 1e6:.1f} MB of mixer "
        f"weights and state at {rates.bandwidth_bytes_per_s / 1e9:.1f} GB/s ({ms['gdn_bytes_floor_s_per_step']:.2f}"
        f" ms) and {gdn['gdn_flops_per_step'] / 1e9:.2f} GFLOP at {rates.flops_per_s / 1e9:.0f} GFLOP/s "
        f"({ms['gdn_flops_floor_s_per_step']:.2f} ms): {100 * gdn['gdn_floor_fraction']:.0f}% of the floor"
    )


def _variant(ctx: BenchContext, ns: argparse.Namespace, block: int, method: str) -> dict[str, Any]:
    """One weight format's run: warm-up iterations (also the calibration's data), then the measured ones, each
    on a fresh engine; the bytes per forward are the loaded model's own (quantized weights with their scales)."""
    ctx = replace(ctx, engine_options={**ctx.engine_options, **quantization_options(ns, False, method)})
    warm_records, warm_engine = _iterations(ctx, ns, block, 0, ns.num_iters_warmup, f"warm-up {method}")
    weights = weight_bytes(warm_engine.runner.model, ctx.args.tie_word_embeddings)
    ctx = replace(ctx, cost=with_measured_weights(ctx.cost, weights, ctx.args))
    before = ctx.measure_rates()
    first = ns.num_iters_warmup * ns.batch_size
    records, engine = _iterations(ctx, ns, block, first, ns.num_iters, f"latency {method}")
    rates = mean_rates(before, ctx.measure_rates())
    stats = engine.stats().experts
    summary = run_summary(_merge(records), ctx.cost, rates, stats)
    quantization = ctx.engine_options["quantization"]
    calibration = _calibration(ctx, ns, block, _merge(warm_records), warm_engine.stats().experts, summary)
    touched = stats.experts_touched_per_step if stats else 0.0
    per_forward = ctx.cost.dense_weight_bytes + ctx.cost.num_moe_layers * touched * ctx.cost.expert_weight_bytes
    batch_latency = [r.wall_s for r in records]
    print(_table(ns, batch_latency, summary))
    if summary["gdn"]:
        print(gdn_line(summary["gdn"], rates))
    return {
        "quantization": quantization,
        "weight_dtype": calibration["weight_dtype"],
        "weight_bytes": weights.total,
        "weight_bytes_per_forward": per_forward,
        "num_params": sum(p.numel() for p in engine.runner.model.parameters()),
        "machine": rates.to_json(),
        "batch_latency_s": {**distribution(batch_latency), "iterations": batch_latency},
        "result": summary,
        "peak_memory_bytes": peak_memory_bytes(ctx.device),
        "calibration": calibration,
    }


def comparison(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each variant against the first: bytes per forward, decode tokens/s and decode step time, as ratios (the
    step time isolates the kernels: quantization may move TPF, which tokens/s also counts)."""
    base = variants[0]
    return [
        {
            "weight_dtype": v["weight_dtype"],
            "weight_bytes": v["weight_bytes"],
            "weight_bytes_per_forward": v["weight_bytes_per_forward"],
            "bytes_ratio": v["weight_bytes_per_forward"] / base["weight_bytes_per_forward"],
            "decode_tokens_per_s": v["result"]["decode_tokens_per_s"],
            "speedup": v["result"]["decode_tokens_per_s"] / base["result"]["decode_tokens_per_s"],
            "decode_step_s": v["result"]["mean_decode_step_s"],
            "step_speedup": base["result"]["mean_decode_step_s"] / v["result"]["mean_decode_step_s"],
            "tpf": v["result"]["tpf"],
        }
        for v in variants
    ]


def _comparison_table(rows: list[dict[str, Any]]) -> str:
    header = [
        "weights",
        "MiB",
        "MB read / forward",
        "x first",
        "decode tok/s",
        "x first",
        "ms / step",
        "x first",
        "TPF",
    ]
    return format_table(
        header,
        [
            [
                r["weight_dtype"],
                r["weight_bytes"] / 2**20,
                r["weight_bytes_per_forward"] / 1e6,
                r["bytes_ratio"],
                r["decode_tokens_per_s"],
                r["speedup"],
                1000 * r["decode_step_s"],
                r["step_speedup"],
                r["tpf"],
            ]
            for r in rows
        ],
    )


def run_latency(ns: argparse.Namespace) -> dict[str, Any]:
    ctx = make_context(ns)
    block = ns.block_length or ctx.args.block_length
    variants = [_variant(ctx, ns, block, method) for method in ns.quantization]
    rows = comparison(variants)
    if len(variants) > 1:
        print(_comparison_table(rows))
    first = variants[0]
    return {
        "bench": "latency",
        "environment": {**ctx.environment, "load_average_end": load_average()},
        "model": {**ctx.model_info, "num_params": first["num_params"]},
        "dtype": ctx.dtype,
        "weight_dtype": first["weight_dtype"],
        "machine": first["machine"],
        "workload": {
            "batch_size": ns.batch_size,
            "prompt_tokens": ns.prompt_tokens,
            "output_tokens": ns.output_tokens,
            "block_length": block,
            "num_iters": ns.num_iters,
            "num_iters_warmup": ns.num_iters_warmup,
            **decoding(ctx, sampling_params(ns, ns.output_tokens)),
        },
        "batch_latency_s": first["batch_latency_s"],
        "result": first["result"],
        "peak_memory_bytes": first["peak_memory_bytes"],
        "calibration": first["calibration"],
        **({"variants": variants, "comparison": rows} if len(variants) > 1 else {}),
    }


def run(ns: argparse.Namespace) -> int:
    finish(run_latency(ns), ns.json_out, ns.plot)
    return 0
