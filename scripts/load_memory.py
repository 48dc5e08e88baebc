"""Peak host memory and time of loading a model, each load in a fresh subprocess ("loading within
bounds": peak RSS at most the final weights plus one shard, over the process's own baseline).

    python scripts/load_memory.py --dir /tmp/clover-wide --write            # a 2-layer Clover of published width
    python scripts/load_memory.py --dir /tmp/clover-wide --quantization none int8 int4 fp8
    python scripts/load_memory.py --dir /tmp/clover-wide --code /path/to/an/older/checkout      # before

The checkpoint is written tensor by tensor (seeded normal values, never a whole model in memory), in shards of
--shard-gib, with the published Clover-35B-A3B widths (hidden 2048, 256 experts of 512, vocab 248,320) and
--layers layers (the first GDN, the last gated attention). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PUBLISHED = dict(
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    partial_rotary_factor=0.25,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    vocab_size=248_320,
    block_length=32,
    max_position_embeddings=4096,
)


def write_checkpoint(out: Path, layers: int, dtype: str, shard_bytes: int) -> None:
    import torch
    from safetensors.torch import save_file

    from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, with_diffusion
    from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
    from diffuserve.model.families.clover_moe.weights import clover_moe_checkpoint_tensors
    from diffuserve.reference.byte_tokenizer import write_byte_tokenizer
    from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config

    out.mkdir(parents=True, exist_ok=True)
    specials = write_byte_tokenizer(out, 320)
    config = make_clover_moe_config(
        "clover-moe-bench", **PUBLISHED, num_hidden_layers=layers, full_attention_interval=layers, torch_dtype=dtype
    )
    config = {"mask_token_id": specials["<|MASK|>"], "eos_token_id": specials["<|endoftext|>"], **config}
    args = with_diffusion(clover_moe_args_from_hf(config), True)
    with torch.device("meta"):
        model = CloverMoeForBlockDiffusion(args, 64)
    state = {name: p for name, p in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    files, weight_map, used = [], {}, 0
    for name, meta in clover_moe_checkpoint_tensors(state, args, per_expert=False):
        value = torch.empty(meta.shape).normal_(0, 0.02, generator=generator).to(getattr(torch, dtype))
        if shard and used + value.numel() * value.element_size() > shard_bytes:
            files.append(_save(shard, out, len(files), save_file))
            shard, used = {}, 0
        shard[name], used = value, used + value.numel() * value.element_size()
        weight_map[name] = len(files)
    files.append(_save(shard, out, len(files), save_file))
    index = {"metadata": {}, "weight_map": {name: files[i] for name, i in weight_map.items()}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _save(shard: dict, out: Path, index: int, save_file) -> str:
    name = f"model-{index + 1:05d}.safetensors"
    save_file(shard, str(out / name), metadata={"format": "pt"})
    return name


def measure_in_child(model_dir: str, method: str) -> None:
    """Runs in the subprocess: baseline RSS after imports, then the load; prints one JSON line."""
    import torch

    from diffuserve.model.loader import load_model

    torch.set_num_threads(1)
    # 16-bit loads pass no quantization argument, so that a revision from before quantization (--code) runs too.
    options = {}
    if method != "none":
        from diffuserve.model.quant.scheme import make_scheme

        options["quantization"] = make_scheme(method)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    _, model = load_model(model_dir, max_model_len=64, **options)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"baseline_rss": baseline, "peak_rss": peak, "seconds": seconds, "weights": weights}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--write", action="store_true", help="write the checkpoint first")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shard-gib", type=float, default=1.0)
    parser.add_argument("--quantization", nargs="*", default=["none"])
    parser.add_argument(
        "--code", default=None, help="load with the diffuserve at this checkout (e.g. the revision before)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child is not None:
        measure_in_child(ns.dir, ns.child)
        return 0
    model_dir = Path(ns.dir)
    if ns.write:
        write_checkpoint(model_dir, ns.layers, ns.dtype, int(ns.shard_gib * 2**30))
    shard = max(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    rows = []
    for method in ns.quantization:
        env = {**os.environ, **({"PYTHONPATH": ns.code} if ns.code else {})}
        done = subprocess.run(
            [sys.executable, __file__, "--dir", str(model_dir), "--child", method],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        row = {"quantization": method, "largest_shard": shard, **json.loads(done.stdout.strip().splitlines()[-1])}
        row["bound"] = row["baseline_rss"] + row["weights"] + shard
        row["within_bound"] = row["peak_rss"] <= row["bound"]
        rows.append(row)
        gib = 2**30
        print(
            f"{method:>5}: peak RSS {row['peak_rss'] / gib:6.2f} GiB (baseline {row['baseline_rss'] / gib:.2f}, "
            f"weights {row['weights'] / gib:.2f}, largest shard {shard / gib:.2f}: bound {row['bound'] / gib:.2f}), "
            f"{row['seconds']:.1f} s"
        )
    print(json.dumps({"model_dir": str(model_dir), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
