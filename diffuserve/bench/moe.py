"""`diffuserve bench moe`: the MoE layers of the sdar-moe-bench model on this machine.

1. Dispatch: the 8 MoE layers' real inputs of one step of 16 requests x a 32-token block (captured from a forward
   of the random-weight model), run through the grouped dispatch, the usual per-expert loop over one-hot-gathered
   tokens, and -- as the yardstick -- two dense matmuls with the same FLOPs as the experts actually need. For
   context also the same loop run per request's block (what an engine without step-level batching does).
2. Offload: the engine generating for 16 requests (fixed 8-step schedule per 32-token block) with no offload,
   then with an expert cache of 25 % and 50 % of each layer's experts, per-block vs per-step residency: hit rate,
   bytes moved per generated token, and a check that the tokens are identical to the run without offload.
3. With --coreset-sizes: block expert coreset routing at each C against per-token routing (moe_coreset.py).
4. With --coreset-rules: dMoE's cumulative rule on a random dMoE, against per-token routing (moe_dmoe.py).

Fixed seeds, a warm-up before timing, interleaved repeats (median), a human table, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diffuserve.bench.moe_coreset import bench_coreset, print_coreset_table
from diffuserve.bench.moe_dmoe import bench_dmoe, print_dmoe_table
from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.layers.moe.dispatch import grouped_experts, looped_experts, run_experts
from diffuserve.model.layers.moe.layer import SparseMoeBlock
from diffuserve.model.loader import load_model
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.random_checkpoint import make_config, resolve_preset, write_random_checkpoint

CACHE_FRACTIONS = (0.25, 0.5)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    preset = resolve_preset(args.preset)
    with tempfile.TemporaryDirectory(prefix="diffuserve-bench-moe-") as tmp:
        model_dir = write_random_checkpoint(
            Path(tmp) / preset, make_config(preset, block_length=args.block_length), seed=0, logit_scale=40.0
        )
        dispatch = bench_dispatch(model_dir, args)
        offload = [] if args.skip_offload else bench_offload(model_dir, args)
        sizes = args.coreset_sizes
        coreset = (
            bench_coreset(Path(tmp), sizes, args.block_length, args.steps_per_block, args.max_tokens) if sizes else []
        )
        rules = args.coreset_rules
        dmoe = bench_dmoe(Path(tmp), rules, args.block_length, args.steps_per_block, args.max_tokens) if rules else []
    result = {
        "bench": "moe",
        "model": preset,
        "threads": args.threads,
        "load_average": list(os.getloadavg()),
        "git_sha": _git_sha(),
        "dispatch": dispatch,
        "offload": offload,
        "coreset": coreset,
        "coreset_rules": dmoe,
    }
    print_tables(result)
    if coreset:
        print_coreset_table(coreset)
    if dmoe:
        print_dmoe_table(dmoe)
    print(json.dumps(result))
    return 0


# ---- dispatch ------------------------------------------------------------------------------------------------
def capture_moe_inputs(model_dir: Path, num_requests: int, block_length: int) -> list[tuple[SparseMoeBlock, Any]]:
    """(layer, (x, weights, ids)) of every MoE layer for one step: each request's 32 prompt tokens as context and
    its block of masks, block-causal (what the engine's step computes), from a dense forward."""
    args, model = load_model(model_dir, max_model_len=4 * block_length)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab_size - 8, (num_requests, block_length), generator=g)
    ids = torch.cat([prompt, torch.full_like(prompt, args.mask_token_id)], dim=1)  # [R, 2B]
    positions = torch.arange(2 * block_length).expand(num_requests, -1)
    mask = block_causal_mask(positions[0], 2 * block_length, block_length)[None, None]
    captured: list[tuple[SparseMoeBlock, Any]] = []
    for layer in model.modules():
        if isinstance(layer, SparseMoeBlock):
            layer.register_forward_hook(lambda m, inp, out: captured.append((m, _routing(m, inp[0], block_length))))
    with torch.inference_mode():
        model(ids, positions, StepInputs(DenseAttentionInputs(mask)))
    return captured


def _routing(layer: SparseMoeBlock, x: torch.Tensor, block_length: int) -> tuple[torch.Tensor, ...]:
    flat = x[:, block_length:].reshape(-1, x.shape[-1]).clone()  # the blocks' tokens [R * B, H]
    weights, ids = layer.gate(flat)
    return flat, weights, ids


def bench_dispatch(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    layers = capture_moe_inputs(model_dir, args.num_requests, args.block_length)
    experts = layers[0][0].experts
    tokens, hidden = layers[0][1][0].shape
    assignments = tokens * layers[0][1][2].shape[1]
    width = experts.intermediate_size
    flops = len(layers) * 6 * assignments * hidden * width  # gate, up, down over the routed assignments
    dense = _dense_operands(assignments, hidden, width)
    paths = {
        "grouped": lambda: [
            grouped_experts(x, w, i, m.experts.gate_up_proj, m.experts.down_proj) for m, (x, w, i) in layers
        ],
        "per_expert_loop": lambda: [
            looped_experts(x, w, i, m.experts.gate_up_proj, m.experts.down_proj) for m, (x, w, i) in layers
        ],
        # The bmm expert backend (moe/backends.py): all experts' runs padded to the longest, two batched GEMMs.
        "padded_bmm": lambda: [
            run_experts("bmm", x, w, i, m.experts.gate_up_proj, m.experts.down_proj) for m, (x, w, i) in layers
        ],
        "dense_matmul": lambda: [_dense_matmuls(*dense) for _ in layers],
        # Not the baseline: the same loop run per request's block, as engines without step-level batching do.
        "loop_per_request": lambda: [
            looped_experts(x[r], w[r], i[r], m.experts.gate_up_proj, m.experts.down_proj)
            for m, (x, w, i) in layers
            for r in _request_rows(tokens, args.block_length)
        ],
    }
    seconds = _time_interleaved(paths, args.repeats)
    grouped, looped, matmul = seconds["grouped"], seconds["per_expert_loop"], seconds["dense_matmul"]
    with torch.inference_mode():
        diff = max(
            float(
                (
                    looped_experts(x, w, i, m.experts.gate_up_proj, m.experts.down_proj)
                    - grouped_experts(x, w, i, m.experts.gate_up_proj, m.experts.down_proj)
                )
                .abs()
                .max()
            )
            for m, (x, w, i) in layers
        )
    return {
        "num_moe_layers": len(layers),
        "tokens": tokens,
        "assignments_per_layer": assignments,
        "grouped_speedup_vs_loop_per_request": seconds["loop_per_request"] / grouped,
        "experts_touched_per_layer": statistics.mean(len(i.unique()) for _, (_, _, i) in layers),
        "expert_gflop": flops / 1e9,
        "seconds": seconds,
        "matmul_gflops": flops / matmul / 1e9,
        "grouped_gflops": flops / grouped / 1e9,
        "loop_gflops": flops / looped / 1e9,
        "grouped_speedup_vs_loop": looped / grouped,
        "grouped_vs_matmul_time": grouped / matmul,
        "max_abs_diff_grouped_vs_loop": diff,
        "padded_bmm_speedup_vs_grouped": grouped / seconds["padded_bmm"],
    }


def _request_rows(tokens: int, block_length: int) -> list[slice]:
    return [slice(start, start + block_length) for start in range(0, tokens, block_length)]


def _dense_operands(assignments: int, hidden: int, width: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    return (
        torch.randn(assignments, hidden, generator=g),
        torch.randn(2 * width, hidden, generator=g),
        torch.randn(assignments, width, generator=g),
        torch.randn(hidden, width, generator=g),
    )


def _dense_matmuls(x: torch.Tensor, gate_up: torch.Tensor, act: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The experts' FLOPs as two dense matmuls (every assignment through one shared expert); returns the second's
    output, as the other paths return theirs."""
    F.linear(x, gate_up)
    return F.linear(act, down)


def _time_interleaved(paths: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds per path; one warm-up each, then the paths take turns, so load changes hit all alike."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        for fn in paths.values():
            fn()
        for _ in range(repeats):
            for name, fn in paths.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# ---- offload -------------------------------------------------------------------------------------------------
def bench_offload(model_dir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One engine run without offload (the reference tokens), then one per cache size and residency policy."""
    from diffuserve import LLM, SamplingParams

    g = torch.Generator().manual_seed(3)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = [
        {"prompt_token_ids": torch.randint(1, min(8000, vocab - 8), (args.block_length,), generator=g).tolist()}
        for _ in range(args.num_requests)
    ]
    params = SamplingParams(decoder="fixed", steps=args.steps_per_block, max_tokens=args.max_tokens, ignore_eos=True)
    options = dict(
        num_pages=args.num_requests * (args.max_tokens // args.block_length + 3),
        max_num_seqs=args.num_requests,
        max_num_batched_tokens=4 * args.num_requests * args.block_length,
        expert_stats=True,
    )
    rows, reference = [], None
    configs = [(None, "none")] + [(f, r) for f in CACHE_FRACTIONS for r in ("block", "step")]
    for fraction, residency in configs:
        extra = (
            {}
            if fraction is None
            else dict(
                expert_offload=True, expert_residency=residency, expert_cache_memory=_cache_bytes(model_dir, fraction)
            )
        )
        llm = LLM(str(model_dir), **options, **extra)
        llm.generate(prompts[:2], params.replace(max_tokens=args.block_length))  # warm-up
        llm = LLM(str(model_dir), **options, **extra)  # fresh counters
        start = time.perf_counter()
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        seconds = time.perf_counter() - start
        reference = tokens if reference is None else reference
        rows.append(_offload_row(llm.engine.stats(), fraction, residency, seconds, tokens == reference))
    return rows


def _cache_bytes(model_dir: Path, fraction: float) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    expert_bytes = 3 * config["hidden_size"] * config["moe_intermediate_size"] * 4  # fp32
    slots = round(fraction * config["num_experts"])
    return slots * expert_bytes * config["num_hidden_layers"]


def _offload_row(stats: Any, fraction: float | None, residency: str, seconds: float, same: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "cache_fraction": fraction,
        "residency": residency,
        "seconds": seconds,
        "generated_tokens": stats.num_generated_tokens,
        "steps": stats.num_steps,
        "tokens_identical": same,
        "experts_touched_per_step": stats.experts.experts_touched_per_step,
        "experts_touched_per_block": stats.experts.experts_touched_per_block,
    }
    if stats.offload is not None:
        o = stats.offload
        row.update(
            slots_per_layer=o.num_slots_per_layer,
            hit_rate=o.hit_rate,
            residency_loads=o.residency_loads,
            fetches=o.fetches,
            wasted_prefetches=o.wasted_prefetches,
            host_computes=o.host_computes,
            bytes_moved=o.bytes_moved,
            bytes_per_generated_token=stats.expert_bytes_per_generated_token,
        )
    return row


# ---- report --------------------------------------------------------------------------------------------------
def print_tables(result: dict[str, Any]) -> None:
    d = result["dispatch"]
    load = ", ".join(f"{x:.2f}" for x in result["load_average"])
    print(
        f"diffuserve bench moe: {result['model']}, {d['num_moe_layers']} MoE layers, {d['tokens']} tokens per step, "
        f"threads {result['threads']}, load average {load}"
    )
    print(f"{'path':<18}{'ms/step':>10}{'GFLOP/s':>10}")
    for name in ("grouped", "per_expert_loop", "padded_bmm", "dense_matmul", "loop_per_request"):
        seconds = d["seconds"][name]
        print(f"{name:<18}{1e3 * seconds:>10.1f}{d['expert_gflop'] / seconds:>10.1f}")
    print(
        f"grouped vs loop: {d['grouped_speedup_vs_loop']:.2f}x faster; grouped time / matmul time for the same "
        f"FLOPs: {d['grouped_vs_matmul_time']:.2f}; experts touched per layer {d['experts_touched_per_layer']:.1f}"
    )
    if not result["offload"]:
        return
    print(
        f"\n{'cache':>6} {'residency':<9}{'hit rate':>9}{'MB/token':>10}{'loads':>7}{'fetches':>8}{'host':>6}"
        f"{'s':>7}  same tokens"
    )
    for r in result["offload"]:
        if r["cache_fraction"] is None:
            print(f"{'-':>6} {'none':<9}{'':>9}{'':>10}{'':>7}{'':>8}{'':>6}{r['seconds']:>7.1f}  reference")
            continue
        print(
            f"{100 * r['cache_fraction']:>5.0f}% {r['residency']:<9}{r['hit_rate']:>9.3f}"
            f"{r['bytes_per_generated_token'] / 1e6:>10.3f}{r['residency_loads']:>7}{r['fetches']:>8}"
            f"{r['host_computes']:>6}{r['seconds']:>7.1f}  {r['tokens_identical']}"
        )


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()
