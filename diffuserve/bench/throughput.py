"""`diffuserve bench throughput`: aggregate generated tokens/s at several concurrencies and block lengths,
the speed-up of N concurrent requests over the same N run one after another, efficiency against this
machine's measured matmul rate and bandwidth, the engine's per-step overhead, and the planner calibration.

"C concurrent requests" = C requests submitted at once to an engine with max_num_seqs = C; every request
generates exactly --output-tokens tokens (EOS ignored). Knows nothing of the CLI's parsing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diffuserve.bench.accuracy import accuracy_vs_tpf
from diffuserve.bench.calibration import calibration_object, fit_efficiency, step_samples
from diffuserve.bench.context import BenchContext, decoding, make_context, max_model_len, sampling_params, warm_up
from diffuserve.bench.engine_run import RunRecord, run_requests
from diffuserve.bench.environment import peak_memory_bytes
from diffuserve.bench.probes import mean_rates
from diffuserve.bench.report import Progress, finish, format_table
from diffuserve.bench.run_metrics import run_summary
from diffuserve.config import SchedulerConfig


def _measure(
    ctx: BenchContext, ns: argparse.Namespace, block: int, prompts: list[list[int]], sequential: bool
) -> tuple[dict[str, Any], RunRecord]:
    concurrency = 1 if sequential else len(prompts)
    engine = ctx.engine(block, concurrency, max_model_len(ns.prompt_tokens, ns.output_tokens, block))
    label = f"block {block}, {len(prompts)} {'sequential' if sequential else 'concurrent'}"
    progress = Progress(label, len(prompts) * ns.output_tokens)
    params = sampling_params(ns, ns.output_tokens)
    before = ctx.measure_rates()
    record = run_requests(
        engine, prompts, params, sequential, on_step=lambda step: progress.advance(step.generated_tokens)
    )
    rates = mean_rates(before, ctx.measure_rates())
    summary = run_summary(record, ctx.cost, rates, engine.stats().experts)
    engine.shutdown()  # a multi-process engine's workers
    mode = "sequential" if sequential else "concurrent"
    print(f"throughput: {label}: {summary['tokens_per_s']:,.1f} tokens/s", file=sys.stderr, flush=True)
    return {
        "block_length": block,
        "concurrency": concurrency,
        "mode": mode,
        "machine": rates.to_json(),
        **summary,
    }, record


def _calibration(ctx: BenchContext, ns: argparse.Namespace, runs: list[tuple[dict, RunRecord]]) -> dict[str, Any]:
    """Predict the first block length's run at 16 concurrent (else the largest) from the *other* runs."""
    block = ns.block_lengths[0]
    candidates = [(r, rec) for r, rec in runs if r["block_length"] == block and r["mode"] == "concurrent"]
    target, target_record = next(
        ((r, rec) for r, rec in candidates if r["concurrency"] == 16),
        max(candidates, key=lambda pair: pair[0]["concurrency"]),
    )
    others = [(r, rec) for r, rec in runs if r["block_length"] == block and rec is not target_record]
    fit_runs = others or [(target, target_record)]
    samples = []
    for r, rec in fit_runs:
        touched = (r["experts"] or {}).get("experts_touched_per_step", 0.0)
        samples += step_samples(rec.steps, ctx.cost, touched)
    fitted = fit_efficiency(samples, ctx.rates)
    experts = target["experts"]
    calibration = calibration_object(
        ctx.model_config,
        ctx.dtype,
        ctx.rates,
        ctx.environment["hardware"]["memory_bytes"],
        {
            "num_seqs": target["concurrency"],
            "prompt_tokens": ns.prompt_tokens,
            "output_tokens": ns.output_tokens,
            "block_length": block,
        },
        fitted,
        target["tpf"],
        experts["experts_touched_per_block"] if experts else None,
        target["decode_tokens_per_s"],
        target["mean_decode_step_s"],
        {
            "tensor_parallel_size": ns.tensor_parallel_size,
            "max_num_seqs": target["concurrency"],
            "max_num_batched_tokens": SchedulerConfig().max_num_batched_tokens,
        },
        ctx.engine_options.get("quantization"),
        ctx.engine_options.get("kv_cache_dtype", "auto"),
    )
    calibration["fit"]["runs"] = [f"block {r['block_length']} {r['mode']} x{r['concurrency']}" for r, _ in fit_runs]
    calibration["fit"]["fit_on_predicted_run"] = not others
    return calibration


def _speedups(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Concurrent over sequential tokens/s, for each block length that has both runs of the same N."""
    speedups = []
    for seq in (r for r in results if r["mode"] == "sequential"):
        conc = next(
            (
                r
                for r in results
                if r["mode"] == "concurrent"
                and r["block_length"] == seq["block_length"]
                and r["num_requests"] == seq["num_requests"]
            ),
            None,
        )
        if conc is not None:
            speedups.append(
                {
                    "block_length": seq["block_length"],
                    "num_requests": seq["num_requests"],
                    "speedup": conc["tokens_per_s"] / seq["tokens_per_s"],
                }
            )
    return speedups


def table(results: list[dict[str, Any]]) -> str:
    headers = [
        "block",
        "mode",
        "reqs",
        "tok/s",
        "decode tok/s",
        "TPF",
        "NFE/req",
        "seqs/step",
        "step ms",
        "comm ms/step",
        "FLOP/s %mm",
        "bytes %bw",
        "overhead %",
        "E/step",
        "E/block",
        "TTFT p50 s",
        "E2E p50 s",
    ]
    rows = []
    for r in results:
        eff, lat, ex = r["efficiency"], r["latency"], r["experts"] or {}
        rows.append(
            [
                r["block_length"],
                r["mode"],
                r["num_requests"],
                r["tokens_per_s"],
                r["decode_tokens_per_s"],
                r["tpf"],
                r["nfe_per_request"],
                r["mean_seqs_per_decode_step"],
                1000 * r["mean_decode_step_s"],
                1000 * r["comm_s_per_step"],
                100 * (eff["matmul_fraction"] or 0.0),
                100 * (eff["bandwidth_fraction"] or 0.0),
                100 * (eff["overhead_fraction"] or 0.0),
                ex.get("experts_touched_per_step"),
                ex.get("experts_touched_per_block"),
                lat["ttft_s"]["p50"],
                lat["e2e_s"]["p50"],
            ]
        )
    return format_table(headers, rows)


def run_throughput(ns: argparse.Namespace) -> dict[str, Any]:
    ctx = make_context(ns)
    count = max([*ns.concurrency, ns.sequential])
    prompts = ctx.prompts(count, ns.prompt_tokens)
    num_params = warm_up(ctx, ns.block_lengths[0], ns.prompt_tokens, sampling_params(ns, ns.output_tokens))
    runs = []
    for block in ns.block_lengths:
        runs += [_measure(ctx, ns, block, prompts[:c], sequential=False) for c in ns.concurrency]
        if ns.sequential:
            runs.append(_measure(ctx, ns, block, prompts[: ns.sequential], sequential=True))
    results = [r for r, _ in runs]
    print(table(results))
    accuracy = None
    if ns.accuracy_examples:
        accuracy = accuracy_vs_tpf(ctx.model_dir, ns.accuracy_examples, ctx.dtype, str(ctx.device))
    return {
        **ctx.run_record("throughput"),
        "model": {**ctx.model_info, "num_params": num_params},
        "workload": {
            "prompt_tokens": ns.prompt_tokens,
            "output_tokens": ns.output_tokens,
            "block_lengths": ns.block_lengths,
            "concurrency": ns.concurrency,
            "sequential": ns.sequential,
            "tensor_parallel_size": ns.tensor_parallel_size,
            "enable_expert_parallel": ns.enable_expert_parallel,
            **decoding(ctx, sampling_params(ns, ns.output_tokens)),
        },
        "results": results,
        "speedups": _speedups(results),
        "peak_memory_bytes": peak_memory_bytes(ctx.device),
        "calibration": _calibration(ctx, ns, runs),
        "accuracy": accuracy,
    }


def run(ns: argparse.Namespace) -> int:
    result = run_throughput(ns)
    for s in result["speedups"]:
        print(f"block {s['block_length']}: {s['num_requests']} concurrent vs sequential: {s['speedup']:.2f}x")
    finish(result, ns.json_out, ns.plot)
    return 0
