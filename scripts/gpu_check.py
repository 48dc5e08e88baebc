"""The MoE GPU check (run by scripts/gpu_check.sh): a random-weight Clover-35B-A3B-shaped model in bf16.

1. dispatch: one MoE layer of that shape at 64 x 32 tokens: grouped (torch._grouped_mm where supported) vs the
   sorted-run loop vs the usual per-expert loop: time and max difference;
2. the whole model on the GPU at batch 1, 8 and 64: tokens/s, TPF, peak memory;
3. expert offload under a 24 GB memory cap at batch 1 and 8: tokens/s, hit rate, bytes moved per token, peak
   memory, and whether the tokens equal those of step 2.

The weights are made on the GPU (`load_format="dummy"`); no checkpoint is read or written, only config.json.
`--dry-run` runs the same code on a tiny shape on the CPU. Every phase checks the time budget and is skipped
(and reported so) if the budget is spent. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.layers.moe.dispatch import (
    combine,
    group_by_expert,
    grouped_experts,
    grouped_mm_supported,
    looped_experts,
    run_expert,
)
from diffuserve.planner.model_presets import MODEL_PRESETS

GiB = 1 << 30
TINY = dict(
    hidden_size=128,
    num_hidden_layers=4,  # 3 GDN + 1 attention (full_attention_interval 4)
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    intermediate_size=256,
    vocab_size=512,
    max_position_embeddings=4096,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shape on the CPU (checks the script)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--offload-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (2 blocks of 32)")
    parser.add_argument("--steps-per-block", type=int, default=8, help="fixed schedule: TPF = 32 / steps")
    parser.add_argument("--memory-cap-gb", type=float, default=24.0)
    parser.add_argument("--expert-cache-gb", type=float, default=14.0)
    parser.add_argument("--budget-s", type=float, default=500.0, help="skip phases that would start after this")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args()
    start = time.monotonic()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available; use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"environment": _environment(device), "dry_run": args.dry_run}
    with tempfile.TemporaryDirectory(prefix="diffuserve-gpu-check-") as tmp:
        model_dir = _write_config(Path(tmp), args.dry_run)
        result["dispatch"] = _dispatch_check(model_dir, device)
        result["full"], tokens = _generation_runs(model_dir, args, device, start, offload=False)
        result["offload"], _ = _generation_runs(model_dir, args, device, start, offload=True, reference=tokens)
    result["elapsed_s"] = time.monotonic() - start
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            name=props.name, memory_gb=props.total_memory / GiB, capability=list(torch.cuda.get_device_capability(0))
        )
    print(f"environment: {env}", flush=True)
    return env


def _write_config(root: Path, dry_run: bool) -> Path:
    """config.json of the Clover-35B-A3B planner preset (or the tiny shape), bf16, no weight files."""
    config = dict(MODEL_PRESETS["Clover-35B-A3B"].config)
    if dry_run:
        config.update(TINY)
    vocab = config["vocab_size"]
    config.update(
        mask_token_id=vocab - 1,
        eos_token_id=vocab - 2,
        torch_dtype="bfloat16",
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        norm_topk_prob=True,
    )
    model_dir = root / "clover-35b-a3b-random"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


def _dispatch_check(model_dir: Path, device: str) -> dict[str, Any]:
    """One MoE layer of the model's shape at 64 x 32 tokens, bf16: the three dispatch paths."""
    config = json.loads((model_dir / "config.json").read_text())
    h, inter, experts, top_k = (
        config[k] for k in ("hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok")
    )
    g = torch.Generator(device=device).manual_seed(0)
    kw = dict(device=device, dtype=torch.bfloat16, generator=g)
    x = torch.randn(64 * 32, h, **kw)
    gate_up, down = torch.randn(experts, 2 * inter, h, **kw) * 0.02, torch.randn(experts, h, inter, **kw) * 0.02
    logits = torch.randn(x.shape[0], experts, device=device, generator=g)
    weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)
    paths = {"grouped": grouped_experts, "sorted_runs": _sorted_runs, "per_expert_loop": looped_experts}
    out = {name: _timed(fn, (x, weights, ids, gate_up, down), device) for name, fn in paths.items()}
    ref = out["sorted_runs"][1].float()
    summary = {
        name: {"ms": 1e3 * t, "max_abs_diff_vs_sorted_runs": float((o.float() - ref).abs().max())}
        for name, (t, o) in out.items()
    }
    summary["grouped_mm_used"] = grouped_mm_supported(x, gate_up)
    print(f"dispatch: {summary}", flush=True)
    return summary


def _sorted_runs(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The grouped dispatch without torch._grouped_mm: one matmul pair per active expert's sorted run."""
    groups = group_by_expert(ids, gate_up.shape[0])
    sorted_x = x.index_select(0, groups.token_of)
    sorted_out = torch.empty_like(sorted_x)
    for expert, rows in groups.runs():
        sorted_out[rows] = run_expert(sorted_x[rows], gate_up[expert], down[expert])
    return combine(sorted_out, weights, groups, x.dtype, x.shape[0])


def _timed(fn: Callable[..., torch.Tensor], inputs: tuple, device: str, repeats: int = 5) -> tuple[float, torch.Tensor]:
    out = fn(*inputs)  # warm-up
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*inputs)
    _sync(device)
    return (time.perf_counter() - start) / repeats, out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _generation_runs(
    model_dir: Path,
    args: argparse.Namespace,
    device: str,
    start: float,
    offload: bool,
    reference: dict[int, list] | None = None,
) -> tuple[list[dict[str, Any]], dict[int, list]]:
    batches = args.offload_batches if offload else args.batches
    if time.monotonic() - start > args.budget_s:
        print(f"{'offload' if offload else 'full'}: skipped (time budget spent)", flush=True)
        return [{"skipped": "time budget"}], {}
    if offload and device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gb * GiB / total))
    _reset_memory(device)
    llm = LLM(str(model_dir), **_engine_options(args, max(batches), offload))
    params = SamplingParams(decoder="fixed", steps=args.steps_per_block, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(_prompts(1, 7), params.replace(max_tokens=32))  # warm-up
    rows, tokens = [], {}
    for batch in batches:
        if time.monotonic() - start > args.budget_s:
            rows.append({"batch": batch, "skipped": "time budget"})
            continue
        rows.append(_measure(llm, batch, params, device, reference))
        tokens[batch] = rows[-1].pop("tokens")
        print(f"{'offload' if offload else 'full'}: {rows[-1]}", flush=True)
    del llm
    gc.collect()
    return rows, tokens


def _engine_options(args: argparse.Namespace, max_batch: int, offload: bool) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        load_format="dummy",
        dtype="bfloat16",
        device="cpu" if args.dry_run else "cuda",
        max_num_seqs=max_batch,
        max_model_len=32 + args.max_tokens + 64,
        max_num_batched_tokens=max(4096, 2 * 32 * max_batch),
        kv_cache_memory=(64 << 20) if args.dry_run else 2 * GiB,
    )
    if offload:
        options.update(expert_offload=True, expert_cache_memory=int(args.expert_cache_gb * GiB))
        if args.dry_run:
            options["expert_cache_memory"] = None  # a quarter of the experts
    return options


def _prompts(batch: int, seed: int) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(1, 500, (32,), generator=g).tolist()} for _ in range(batch)]


def _measure(
    llm: LLM, batch: int, params: SamplingParams, device: str, reference: dict[int, list] | None
) -> dict[str, Any]:
    before = llm.engine.stats()
    _sync(device)
    started = time.perf_counter()
    outputs = llm.generate(_prompts(batch, batch), params)
    _sync(device)
    seconds = time.perf_counter() - started
    stats = llm.engine.stats()
    tokens = [o.outputs[0].token_ids for o in outputs]
    generated = sum(len(t) for t in tokens)
    row: dict[str, Any] = {
        "batch": batch,
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
        "tpf": generated / max(1, sum(o.num_forwards for o in outputs)),
        "steps": stats.num_steps - before.num_steps,
        "tokens": tokens,
    }
    if device == "cuda":
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / GiB
    if stats.offload is not None:  # this batch's share of the cumulative counters
        now, then = stats.offload, before.offload
        hits, misses = now.hits - then.hits, now.misses - then.misses
        row.update(
            hit_rate=hits / max(1, hits + misses),
            host_computes=now.host_computes - then.host_computes,
            fetches=now.fetches - then.fetches,
            residency_loads=now.residency_loads - then.residency_loads,
            bytes_per_generated_token=(now.bytes_moved - then.bytes_moved) / max(1, generated),
        )
    if reference is not None and batch in reference:
        row["tokens_equal_full_gpu"] = tokens == reference[batch]
    return row


def _reset_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    sys.exit(main())
