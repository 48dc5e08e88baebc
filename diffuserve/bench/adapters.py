"""`diffuserve bench adapters`: generated tokens/s of one batch of concurrent requests on the base model alone (no
`--enable-lora`) and on an engine serving LoRA adapters with 0, 1 and 4 distinct adapters among the batch's
requests, in one run, with the ratio of each to the base model alone.

The adapters are random (seeded) PEFT adapters of `--rank` on every attention and Gated DeltaNet projection and
dense / shared-expert MLP of the model (`random_adapter`), written next to the model; the requests are random
prompts, every one generating exactly `--output-tokens` tokens (EOS ignored), at temperature 0. Each variant is
warmed up once, then timed `--repeats` times; the best wall time is reported. Knows nothing of the CLI's parsing.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from diffuserve.bench.environment import environment
from diffuserve.bench.report import finish, format_table
from diffuserve.bench.workload import default_cache_dir, prepare_model, random_prompts

ADAPTABLE = re.compile(
    r".*\.(self_attn\.[qkvo]_proj|attention\.(query_key_value|dense)|linear_attn\.(in_proj_\w+|out_proj)"
    r"|shared_experts?\.(gate|up|down)_proj|mlp\.(gate|up|down)_proj)\.weight"
)
"""Checkpoint weights a served adapter may target (docs/serving/adapters.md): attention, Gated DeltaNet
projections, dense MLPs and shared experts; never routed experts."""


def random_adapter(model_dir: Path, out: Path, rank: int, seed: int) -> Path:
    """A random PEFT adapter (A and B seeded, B not zero) on every adaptable 2-d weight of `model_dir`'s
    checkpoint, written to `out`."""
    generator = torch.Generator().manual_seed(seed)
    tensors, targets = {}, set()
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, weight in load_file(file).items():
            name = name.replace("model.language_model.", "model.")
            if not ADAPTABLE.fullmatch(name) or weight.dim() != 2 or ".experts." in name:
                continue
            module = name.removesuffix(".weight")
            targets.add(module.rsplit(".", 1)[-1])
            fan_out, fan_in = weight.shape
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.02
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.02
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(targets), "bias": "none"}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def _timed(llm: Any, prompts: list[list[int]], params: Any, lora: list | None, repeats: int) -> float:
    """The best wall time of `repeats` runs of the batch (after one warm-up run)."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs, params, lora_request=lora, use_tqdm=False)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(inputs, params, lora_request=lora, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return best


def _spread(paths: list[Path], num_prompts: int) -> list | None:
    """Request i's adapter: the adapters in turn (None, the base model, for every request when there are none)."""
    from diffuserve import LoRARequest

    if not paths:
        return None
    return [
        LoRARequest(f"a{i % len(paths)}", i % len(paths) + 1, str(paths[i % len(paths)])) for i in range(num_prompts)
    ]


def run(ns: argparse.Namespace) -> int:
    from diffuserve import LLM, SamplingParams

    if ns.threads:
        torch.set_num_threads(ns.threads)
    model_dir = Path(prepare_model(ns.model, ns.model_cache_dir))
    adapters = Path(ns.adapter_dir) if ns.adapter_dir else default_cache_dir() / "adapters" / model_dir.name
    paths = [random_adapter(model_dir, adapters / f"rank{ns.rank}-{i}", ns.rank, i) for i in range(4)]
    options = {"max_num_seqs": ns.num_prompts, "dtype": ns.dtype, "device": ns.device}
    base = LLM(str(model_dir), **options)
    args = base.engine.args
    excluded = frozenset({args.mask_token_id, *args.eos_token_ids})  # no prompt may hold a mask or end at once
    prompts = random_prompts(ns.num_prompts, ns.prompt_tokens, args.vocab_size, ns.seed, excluded)
    params = SamplingParams(max_tokens=ns.output_tokens, ignore_eos=True, temperature=0.0)
    rows = [("base model, no --enable-lora", _timed(base, prompts, params, None, ns.repeats))]
    del base
    served = LLM(str(model_dir), **options, enable_lora=True, max_loras=4, max_lora_rank=ns.rank)
    for count in (0, 1, 4):
        lora = _spread(paths[:count], len(prompts))
        rows.append(
            (f"--enable-lora, {count} adapters in the batch", _timed(served, prompts, params, lora, ns.repeats))
        )
    tokens, base_wall = ns.num_prompts * ns.output_tokens, rows[0][1]
    results = [
        {"variant": label, "wall_s": round(wall, 4), "tokens_per_s": round(tokens / wall, 1),
         "vs_base": round(base_wall / wall, 3)}
        for label, wall in rows
    ]  # fmt: skip
    headers = ["variant", "tokens/s", "wall s", "vs base"]
    print(format_table(headers, [[r["variant"], r["tokens_per_s"], r["wall_s"], r["vs_base"]] for r in results]))
    result = {
        "bench": "adapters",
        "environment": environment(),
        "model": model_dir.name,
        "workload": {
            k: getattr(ns, k) for k in ("num_prompts", "prompt_tokens", "output_tokens", "rank", "repeats", "threads")
        },
        "results": results,
    }
    finish(result, ns.json_out, None)
    return 0
