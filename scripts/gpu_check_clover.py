"""GPU check of full-size Clover (`scripts/gpu_check.sh --clover`): Clover-35B-A3B in the published layout (the
planner's `Clover-35B-A3B` preset: 30 Gated DeltaNet + 10 gated attention layers, 256 experts top-8 plus a shared
expert, vocabulary 248,320, 32-token blocks) with random bf16 weights on one GPU, served through the public `LLM`
API (whichever engine path runs clover_moe on the checkout: the recompute runner or the hybrid-state engine).

1. load: time to build the model and fill its weights (`load_format="dummy"`: 69 GB of weights cannot be written
   to the machine's disk; a small marker file carries the four block-diffusion tensor names, so the engine runs
   block diffusion as for the real checkpoint), and the memory it holds;
2. memory per sequence: peak memory at 1 and at N concurrent sequences of the same context, (peak_N - peak_1) /
   (N - 1), against the planner's `kv_bytes_per_token * context + state_bytes_per_sequence` for the same
   config.json (`diffuserve plan <config.json> --json`);
3. decode at 1 / 8 / 32 concurrent requests, block 32, fixed schedule (TPF = 32 / steps): tokens/s, TPF;
4. one 128K-context request (prompt = context - one block): seconds, peak memory, or the error it raised.

`--reduced` runs the same code on a small shape of the same layout (8 layers, 6 GDN + 2 attention) with a short
context, on the CPU unless `--device` says otherwise: the dry run where no GPU is available. Every phase checks
the time budget and is reported as skipped when it is spent; a failing phase is reported, never fatal. The last
line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from diffuserve import LLM, SamplingParams
from diffuserve.planner.model_presets import MODEL_PRESETS

GiB = 1 << 30
REDUCED = dict(
    hidden_size=256,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    vocab_size=4096,
    max_position_embeddings=4096,
)
"""The published layout (full_attention_interval 4, partial RoPE, gated shared expert) at a CPU-sized width."""
BLOCK = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reduced", action="store_true", help="small shape, short context (the CPU dry run)")
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (default with --reduced)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=96, help="prompt of the decode runs")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per decode request (2 blocks of 32)")
    parser.add_argument("--steps-per-block", type=int, default=8, help="fixed schedule: TPF = 32 / steps")
    parser.add_argument(
        "--memory-context",
        type=int,
        default=None,
        help="context of the memory-per-sequence runs (default 8192; 512 with --reduced)",
    )
    parser.add_argument("--memory-sequences", type=int, default=4, help="N of the memory-per-sequence runs")
    parser.add_argument(
        "--long-context",
        type=int,
        default=None,
        help="context of the long request (default 131072; 2048 with --reduced)",
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="skip phases that would start after this")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 with --reduced)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    args.threads = args.threads or (1 if args.reduced else None)
    args.device = args.device or ("cpu" if args.reduced else "cuda")
    args.memory_context = args.memory_context or (512 if args.reduced else 8192)
    args.long_context = args.long_context or (2048 if args.reduced else 131072)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_clover: CUDA is not available; use --reduced (CPU) where there is no GPU", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.monotonic()
    result: dict[str, Any] = {"device": _device_name(args.device), "reduced": args.reduced}
    with tempfile.TemporaryDirectory(prefix="diffuserve-clover-check-") as tmp:
        model_dir = write_model_dir(Path(tmp), args.reduced)
        result["config"] = {
            k: v
            for k, v in json.loads((model_dir / "config.json").read_text()).items()
            if k in ("hidden_size", "num_hidden_layers", "num_experts", "vocab_size")
        }
        llm, result["load"] = _phase("load", lambda: _load(model_dir, args), start, args)
        if llm is not None:
            phases = {
                "memory_per_sequence": lambda: _memory_per_sequence(llm, model_dir, args),
                "decode": lambda: _decode(llm, args),
                "long_context": lambda: _long_context(llm, args),
            }
            for name, run in phases.items():
                result[name] = _phase(name, run, start, args)[1]
    result["elapsed_s"] = round(time.monotonic() - start, 1)
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def write_model_dir(root: Path, reduced: bool) -> Path:
    """config.json of the preset (or its reduced shape), bf16, and a marker safetensors with the four diffusion
    tensor names of layer 0 (the loader decides from tensor names whether a checkpoint can run block diffusion)."""
    config = {**MODEL_PRESETS["Clover-35B-A3B"].config, **(REDUCED if reduced else {})}
    vocab = config["vocab_size"]
    config.update(
        mask_token_id=vocab - 1,
        eos_token_id=vocab - 2,
        torch_dtype="bfloat16",
        rms_norm_eps=1e-6,
        rope_theta=1e7,
        block_length=BLOCK,
    )
    model_dir = root / ("clover-moe-reduced" if reduced else "clover-35b-a3b-random")
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    prefix = "model.layers.0.linear_attn."
    marker = {
        prefix + "conv_right_weight": torch.zeros(1, 1),
        prefix + "bd_softmax_logit_scale": torch.zeros(1),
        prefix + "bd_softmax_history_bias": torch.zeros(1),
        prefix + "bd_softmax_history_c": torch.zeros(1),
    }
    save_file(marker, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    return model_dir


def _phase(name: str, run: Any, start: float, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Runs one phase unless the budget is spent; an exception becomes the phase's reported error."""
    if time.monotonic() - start > args.budget_s:
        report: dict[str, Any] = {"skipped": "time budget"}
        value = None
    else:
        try:
            value, report = run() if name == "load" else (None, run())
        except Exception as error:  # every failure is reported; the next phase still runs
            value, report = None, {"error": f"{type(error).__name__}: {error}"[:500]}
    print(f"{name}: {report}", flush=True)
    return value, report


def _load(model_dir: Path, args: argparse.Namespace) -> tuple[LLM, dict[str, Any]]:
    _reset_memory(args.device)
    started = time.perf_counter()
    # bf16 on a CPU without bf16 matmul units is tens of times slower than fp32: the dry run checks code, not speed.
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    llm = LLM(
        str(model_dir),
        load_format="dummy",
        dtype=dtype,
        device=args.device,
        max_num_seqs=max([*args.concurrency, args.memory_sequences]),
        max_model_len=args.long_context,
        max_num_batched_tokens=max(4096, 2 * BLOCK * max(args.concurrency)),
    )
    _sync(args.device)
    report = {
        "seconds": round(time.perf_counter() - started, 2),
        "has_diffusion": llm.engine.args.extra["hybrid"].has_diffusion,
    }
    report.update(_memory(args.device, "allocated_gib"))
    return llm, report


def _planned(model_dir: Path, context: int) -> dict[str, float]:
    """The planner's per-sequence terms for this config.json at this context."""
    command = [
        sys.executable,
        "-m",
        "diffuserve",
        "plan",
        str(model_dir / "config.json"),
        "--context-length",
        str(context),
        "--json",
    ]
    memory = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    per_device = memory["memory_per_device"]
    kv, state = per_device["kv_bytes_per_token"] * context, per_device["state_bytes_per_sequence"]
    return {"kv_bytes": kv, "state_bytes": state, "bytes_per_sequence": kv + state}


def _memory_per_sequence(llm: LLM, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    context, count = args.memory_context, args.memory_sequences
    params = SamplingParams(decoder="fixed", steps=args.steps_per_block, max_tokens=BLOCK, ignore_eos=True)
    peaks = {}
    for n in (1, count):
        _reset_memory(args.device)
        llm.generate(_prompts(n, context - BLOCK, seed=n), params)
        peaks[n] = _peak_bytes(args.device)
    planned = _planned(model_dir, context)
    report: dict[str, Any] = {
        "context": context,
        "sequences": count,
        "planned_bytes_per_sequence": planned["bytes_per_sequence"],
        "planned_kv_bytes": planned["kv_bytes"],
        "planned_state_bytes": planned["state_bytes"],
    }
    if peaks[1] is not None:
        measured = (peaks[count] - peaks[1]) / (count - 1)
        report.update(
            peak_bytes=peaks,
            measured_bytes_per_sequence=measured,
            measured_over_planned=measured / planned["bytes_per_sequence"],
        )
    else:
        report["measured_bytes_per_sequence"] = "not measured on the CPU (no allocator statistics)"
    return report


def _decode(llm: LLM, args: argparse.Namespace) -> list[dict[str, Any]]:
    params = SamplingParams(decoder="fixed", steps=args.steps_per_block, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(_prompts(1, args.prompt_tokens, seed=0), params.replace(max_tokens=BLOCK))  # warm-up
    rows = []
    for n in args.concurrency:
        _reset_memory(args.device)
        started = time.perf_counter()
        outputs = llm.generate(_prompts(n, args.prompt_tokens, seed=n), params)
        _sync(args.device)
        seconds = time.perf_counter() - started
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        forwards = sum(o.outputs[0].num_forwards for o in outputs)
        row = {
            "concurrency": n,
            "seconds": round(seconds, 3),
            "tokens_per_s": generated / seconds,
            "tpf": generated / max(1, forwards),
            **_memory(args.device, "peak_gib", peak=True),
        }
        print(f"decode: {row}", flush=True)
        rows.append(row)
    return rows


def _long_context(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    """One request whose prompt fills the context but its last block."""
    params = SamplingParams(decoder="fixed", steps=args.steps_per_block, max_tokens=BLOCK, ignore_eos=True)
    _reset_memory(args.device)
    started = time.perf_counter()
    output = llm.generate(_prompts(1, args.long_context - BLOCK, seed=7), params)[0]
    _sync(args.device)
    return {
        "context": args.long_context,
        "seconds": round(time.perf_counter() - started, 2),
        "generated": len(output.outputs[0].token_ids),
        "forwards": output.outputs[0].num_forwards,
        **_memory(args.device, "peak_gib", peak=True),
    }


def _prompts(count: int, length: int, seed: int) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(1, 4000, (length,), generator=generator).tolist()} for _ in range(count)]


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reset_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_bytes(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def _memory(device: str, key: str, peak: bool = False) -> dict[str, float]:
    if device != "cuda":
        return {}
    used = torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()
    return {key: round(used / GiB, 2)}


if __name__ == "__main__":
    sys.exit(main())
