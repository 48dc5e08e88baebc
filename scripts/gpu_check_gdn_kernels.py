"""GPU check of the Gated DeltaNet CUDA kernels (run by `scripts/gpu_check.sh --gdn-kernels`): the torch path
against the kernel path (flash-linear-attention's delta rule, causal-conv1d's conv;
model/families/clover_moe/gdn_kernels.py) on a random `clover-moe-bench` checkpoint (6 GDN + 2 attention layers,
no diffusion tensors: autoregressive).

1. logits of two 200-token prompts (GDN chunks of 64), in one pass and split 150 + 1 + 49 (the state carried,
   the one-token kernels): max |torch - kernels| per dtype (fp32, bf16), each split compared with the same split
   on the torch path;
2. greedy decode (temperature 0, 48 tokens, four prompts, bf16) through `LLM`: torch eager, kernels eager and kernels
   compiled (the default on CUDA): the token ids equal or not.

Reported, never asserted: fla's fp32 kernels may multiply in TF32, so fp32 logits can differ by ~1e-3. Where the
packages do not import the check says so and stops. `--device cpu` runs the same code with the torch path on both
sides (the dry run of the script itself). The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.families.clover_moe import gdn_kernels
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.gated_deltanet import set_gdn_backend
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

SPLITS = (150, 1, 49)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run (torch on both sides)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    kernels = "fla" if device.type == "cuda" else "torch"
    result: dict[str, Any] = {"device": args.device, "kernel_backend": kernels}
    found = gdn_kernels.select("auto", device)
    result["found"] = {"fla": found.chunk_rule is not None, "causal_conv1d": found.conv_fn is not None}
    if device.type == "cuda" and found.chunk_rule is None:
        result["skipped"] = "flash-linear-attention does not import: pip install -e '.[cuda-kernels]'"
    else:
        with tempfile.TemporaryDirectory(prefix="diffuserve-gdn-kernels-") as tmp:
            config = make_clover_moe_config("clover-moe-bench")
            model_dir = write_clover_moe_checkpoint(Path(tmp) / "m", config, seed=0, init_std=0.05, diffusion=False)
            for dtype in ("float32", "bfloat16"):
                result[f"logits_{dtype}"] = _phase(lambda d=dtype: _logits(model_dir, d, device, kernels))
            result["greedy"] = _phase(lambda: _greedy(model_dir, device, kernels))
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def _phase(run: Any) -> Any:
    try:
        return run()
    except Exception as error:  # reported; the next phase still runs
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def _logits(model_dir: Path, dtype: str, device: torch.device, kernels: str) -> dict[str, float]:
    _, model = load_model(model_dir, dtype, str(device))
    dense = DenseClover(model)
    ids = torch.randint(1, 4000, (2, sum(SPLITS)), generator=torch.Generator().manual_seed(1)).to(device)
    runs = {}
    with torch.no_grad():
        for backend in ("torch", kernels):
            set_gdn_backend(model, backend, device)
            whole = model.compute_logits(dense.forward_causal(ids)[0]).float()
            state, pieces = None, []
            for piece in ids.split(SPLITS, dim=1):
                hidden, state = dense.forward_causal(piece, state)
                pieces.append(model.compute_logits(hidden).float())
            runs[backend] = (whole, torch.cat(pieces, dim=1))
    (torch_whole, torch_split), (kernel_whole, kernel_split) = runs["torch"], runs[kernels]
    report = {
        "max_abs_diff_whole": (kernel_whole - torch_whole).abs().max().item(),
        "max_abs_diff_split": (kernel_split - torch_split).abs().max().item(),
        "logit_scale": torch_whole.abs().max().item(),
    }
    print(f"logits {dtype}: {report}", flush=True)
    return report


def _greedy(model_dir: Path, device: torch.device, kernels: str) -> dict[str, Any]:
    prompts = [{"prompt_token_ids": list(range(1 + 7 * i, 90 + 7 * i))} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    variants = {"torch": ("torch", True), "kernels_eager": (kernels, True), "kernels_compiled": (kernels, None)}
    dtype = "bfloat16" if device.type == "cuda" else "float32"  # bf16 matmuls crawl on most CPUs
    small = {"max_num_seqs": 4, "max_model_len": 256, "kv_cache_memory": 1 << 30}
    tokens = {}
    for name, (backend, eager) in variants.items():
        llm = LLM(str(model_dir), dtype=dtype, device=str(device), gdn_backend=backend, enforce_eager=eager, **small)
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
        gc.collect()
    report = {name: tokens[name] == tokens["torch"] for name in ("kernels_eager", "kernels_compiled")}
    print(f"greedy tokens equal to torch: {report}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(main())
