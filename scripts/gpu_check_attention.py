"""GPU check of the attention backends (run by `scripts/gpu_check.sh --attention`): the per-sequence loop, the
batched SDPA groups and FlashInfer's varlen paged kernel (model/layers/attention_backends; flashinfer needs
`pip install -e '.[cuda-kernels]'`), on the device.

1. outputs: random steps of every shape the runners make (diffuserve/reference/attention_steps.py: blocks, prefill
   chunks, fused commits, hybrid rows, scoring variants, padding rows) in bf16, each backend's max |out - ref|
   with ref = the loop in fp32 over the same bf16 values (and the batched backend in fp32 against it);
2. time of one step's attention over 8 layers (the bench model's heads: 8 query, 2 KV, 64 dims) at 1 / 16 / 64
   sequences of one 4-token block over 640 keys, and with a quarter of them fused commits, per backend;
3. greedy tokens (bf16, 48 tokens, 8 prompts) of a random sdar-moe-bench through `LLM` with each backend eager,
   and with auto compiled (the CUDA default): equal to the loop's or not.

Reported, never asserted: bf16 kernels round differently. Where flashinfer does not import its rows say why.
`--device cpu` runs the same code with loop and batched only (the dry run of the script itself). The last line
printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.layers.attention import paged_attention
from diffuserve.model.layers.attention_backends.interface import AttentionBackend, PagedAttentionInputs
from diffuserve.model.layers.attention_backends.selection import select
from diffuserve.reference.attention_steps import KINDS, AttentionStep, StepShape, random_kinds, random_step
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

BENCH_HEADS = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64}
SMALL = {"max_num_seqs": 8, "max_model_len": 512, "kv_cache_memory": 1 << 30}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run (no flashinfer)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    backends = _backends(device)
    ready = {n: b for n, b in backends.items() if not isinstance(b, str)}
    result: dict[str, Any] = {
        "device": args.device,
        "backends": {n: "ok" if n in ready else backends[n] for n in backends},
    }
    result["outputs"] = _phase(lambda: _outputs(ready, device))
    result["timing_ms"] = _phase(lambda: _timing(ready, device))
    result["greedy"] = _phase(lambda: _greedy(device, [n for n in backends if n in ready]))
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def _backends(device: torch.device) -> dict[str, AttentionBackend | str]:
    """name -> the backend, or why it cannot run here."""
    found: dict[str, AttentionBackend | str] = {}
    for name in ("loop", "batched", "flashinfer"):
        try:
            found[name] = select(name, device, torch.bfloat16)
        except ValueError as error:
            found[name] = str(error)
    print(f"backends: { {n: b if isinstance(b, str) else 'ok' for n, b in found.items()} }", flush=True)
    return found


def _phase(run: Any) -> Any:
    try:
        return run()
    except Exception as error:  # reported; the next phase still runs
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def _on(step: AttentionStep, device: torch.device, dtype: torch.dtype) -> AttentionStep:
    """The step moved to `device`, activations and caches in `dtype`, the caches fresh copies."""
    base = step.inputs
    sequences = tuple(
        dataclasses.replace(s, key_slots=s.key_slots.to(device), mask=None if s.mask is None else s.mask.to(device))
        for s in base.sequences
    )
    caches = [[c[0].to(device, dtype, copy=True)] for c in (base.k_caches, base.v_caches)]
    inputs = PagedAttentionInputs(base.slot_mapping.to(device), sequences, *caches)
    return AttentionStep(*(t.to(device, dtype) for t in (step.q, step.k, step.v)), inputs)


def _attend(backend: AttentionBackend, step: AttentionStep, layers: int = 1) -> torch.Tensor:
    out = step.q
    for _ in range(layers):
        out = paged_attention(step.q, step.k, step.v, step.inputs, 0, 0.125, backend)
    return out


def _outputs(backends: dict[str, AttentionBackend], device: torch.device) -> dict[str, float]:
    rng = random.Random(0)
    worst = {name: 0.0 for name in backends} | {"batched_fp32": 0.0}
    mixes = [list(KINDS) * 3, *(random_kinds(rng, 24) for _ in range(20))]
    for seed, kinds in enumerate(mixes):
        step = random_step(kinds, StepShape(padding_rows=5, **BENCH_HEADS, max_blocks=40), seed)
        half = _on(step, device, torch.bfloat16)
        reference = _attend(backends["loop"], _on(_on(step, device, torch.bfloat16), device, torch.float32))
        for name, backend in backends.items():
            out = _attend(backend, _on(half, device, torch.bfloat16)).float()
            worst[name] = max(worst[name], (out - reference).abs().max().item())
        fp32 = _attend(backends["batched"], _on(step, device, torch.float32))
        exact = _attend(backends["loop"], _on(step, device, torch.float32))
        worst["batched_fp32"] = max(worst["batched_fp32"], (fp32 - exact).abs().max().item())
    print(f"max |out - loop fp32| over {len(mixes)} steps: {worst}", flush=True)
    return worst


def _timing(backends: dict[str, AttentionBackend], device: torch.device) -> dict[str, float]:
    shape = StepShape(block_length=4, page_size=16, max_blocks=160, **BENCH_HEADS)
    times = {}
    for count in (1, 16, 64):
        for label, kinds in (("blocks", ["block"] * count), ("mixed", (["block"] * 3 + ["fused"]) * (count // 4))):
            if not kinds:
                continue
            step = _on(random_step(kinds, shape, count), device, torch.bfloat16)
            for name, backend in backends.items():
                times[f"{name}/{label}/{count}"] = _median_ms(lambda b=backend, s=step: _attend(b, s, 8), device)
    print(f"attention over 8 layers, ms: {times}", flush=True)
    return times


def _median_ms(run: Any, device: torch.device, repeats: int = 7) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    samples = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        samples.append((time.perf_counter() - started) * 1e3)
    return sorted(samples)[repeats // 2]


def _greedy(device: torch.device, names: list[str]) -> dict[str, Any]:
    prompts = [[(7 * i + 13 * j) % 8000 + 300 for j in range(20 + 37 * i)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    dtype = "bfloat16" if device.type == "cuda" else "float32"  # bf16 matmuls crawl on most CPUs
    variants = {f"{n}_eager": (n, True) for n in names} | {"auto_compiled": ("auto", None)}
    if device.type != "cuda":
        variants.pop("auto_compiled")  # the CPU default is eager
    tokens = {}
    with tempfile.TemporaryDirectory(prefix="diffuserve-attention-") as tmp:
        model_dir = write_random_checkpoint(Path(tmp) / "m", make_config("sdar-moe-bench", block_length=4), seed=0)
        for name, (backend, eager) in variants.items():
            llm = LLM(
                str(model_dir), dtype=dtype, device=str(device), attention_backend=backend, enforce_eager=eager, **SMALL
            )
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            tokens[name] = [list(o.outputs[0].token_ids) for o in outputs]
            del llm
            gc.collect()
    report = {name: tokens[name] == tokens["loop_eager"] for name in tokens if name != "loop_eager"}
    print(f"greedy tokens equal to the loop's: {report}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(main())
