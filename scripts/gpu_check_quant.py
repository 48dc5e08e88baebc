"""GPU check of quantized weights (run by `scripts/gpu_check.sh --quantization fp8|int4`), prepared for one H200
(under 8 minutes), never run on the machines the project is built on:

1. kernels: which matmul each Clover-35B-A3B shape gets (scaled-mm-fp8 / tinygemm-int4 on sm90), its error
   against the float64 dequantize-then-matmul reference of the same quantized weights (bf16 activations; fp8's
   activations also pass through fp8 per token), and its time against the bf16 `F.linear` at M = 1, 32, 256;
2. the engine on a random sdar-moe-bench and clover-moe-bench in bf16, quantized on load vs bf16: weight bytes,
   decode tokens/s at 1 and 16 requests, the share of greedy tokens equal to bf16's (reported, not asserted);
3. `diffuserve quantize` (compressed-tensors) of the same checkpoint, loaded on the GPU: logits equal to
   quantizing on load.

`--device cpu` runs the same code at the same steps on tiny shapes and models (the dry run). The last line printed
is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diffuserve import LLM, SamplingParams
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.model.quant.formats import FP8_MAX, QuantParts
from diffuserve.model.quant.kernels import select_kernel
from diffuserve.model.quant.quantize import on_load_format, quantize
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.model.quant.writer import quantize_checkpoint
from diffuserve.model.weight_bytes import weight_bytes
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.reference.reference_quant import reference_dequantize

SHAPES = {"expert gate_up": (1024, 2048), "expert down": (2048, 512), "gdn in_proj_qkv": (8192, 2048)}
TINY_SHAPES = {"tiny": (256, 256)}


def _timed(fn, repeats: int = 20) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def check_kernels(method: str, device: torch.device, shapes: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    fmt = on_load_format(method, 128)
    rows = []
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device=device) * 0.02
        parts = quantize(w, fmt, torch.bfloat16)
        kernel = select_kernel(fmt, n, k, device, torch.bfloat16)
        tensors = kernel.prepare(fmt, parts)
        reference = reference_dequantize(fmt, QuantParts(*(None if p is None else p.cpu() for p in parts)))
        dense = w.bfloat16()
        for m in (1, 32, 256):
            x = torch.randn(m, k, device=device).bfloat16()
            out = kernel.matmul(x, fmt, tensors).double().cpu()
            seen = x.float().cpu().double()
            if kernel.name == "scaled-mm-fp8":  # the activations the kernel multiplies: fp8 per token
                scale = seen.abs().amax(1, keepdim=True) / FP8_MAX
                seen = (seen / scale).to(torch.float8_e4m3fn).double() * scale
            expected = seen @ reference.T
            error = ((out - expected).abs().max() / expected.abs().max()).item()
            quantized_s = _timed(lambda: kernel.matmul(x, fmt, tensors))  # noqa: B023
            bf16_s = _timed(lambda: F.linear(x, dense))  # noqa: B023
            rows.append(
                {
                    "shape": name,
                    "n": n,
                    "k": k,
                    "m": m,
                    "kernel": kernel.name,
                    "relative_error": error,
                    "quantized_us": 1e6 * quantized_s,
                    "bf16_us": 1e6 * bf16_s,
                    "speedup": bf16_s / quantized_s,
                }
            )
            print(
                f"{name:>16} M={m:<4} {kernel.name:>14}: error {error:.2e}, {1e6 * quantized_s:8.1f} us vs bf16 "
                f"{1e6 * bf16_s:8.1f} us ({bf16_s / quantized_s:.2f}x)"
            )
    return rows


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], time.perf_counter() - started


def check_engine(model_dir: Path, method: str, device: str, output_tokens: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    engines = {
        "bf16": LLM(str(model_dir), dtype="bfloat16", device=device, max_num_seqs=16),
        method: LLM(str(model_dir), dtype="bfloat16", device=device, max_num_seqs=16, quantization=method),
    }
    tokens = {}
    for name, llm in engines.items():
        model = llm.engine.runner.model
        result[name] = {"weight_bytes": weight_bytes(model).total}
        vocab = llm.engine.args.vocab_size
        _greedy(llm, [list(range(1, 41))], 8)  # warm-up
        for batch in (1, 16):
            prompts = [[(i * 97 + j * 13) % (vocab - 64) + 1 for j in range(128)] for i in range(batch)]
            out, seconds = _greedy(llm, prompts, output_tokens)
            result[name][f"batch_{batch}_tokens_per_s"] = batch * output_tokens / seconds
            tokens[(name, batch)] = out
    same = [a == b for batch in (1, 16) for a, b in zip(tokens[("bf16", batch)], tokens[(method, batch)])]
    result["same_tokens_as_bf16"] = sum(same) / len(same)
    print(f"{model_dir.name}: {json.dumps(result)}")
    return result


def check_written_checkpoint(model_dir: Path, method: str, device: str, tmp: Path) -> dict[str, Any]:
    """A Clover checkpoint (its causal trunk's logits) written by `diffuserve quantize`, then loaded."""
    written = tmp / f"{model_dir.name}-{method}"
    quantize_checkpoint(model_dir, written, make_scheme(method))
    _, loaded = load_model(written, dtype="bfloat16", device=device, max_model_len=256)
    _, on_load = load_model(
        model_dir, dtype="bfloat16", device=device, max_model_len=256, quantization=make_scheme(method)
    )
    ids = torch.arange(1, 33, device=device)[None]
    with torch.no_grad():
        a, b = DenseClover(loaded).forward_causal(ids)[0], DenseClover(on_load).forward_causal(ids)[0]
        difference = (loaded.compute_logits(a) - on_load.compute_logits(b)).abs().max().item()
    print(f"written {method} checkpoint vs quantized on load: max |logit difference| {difference:.3g}")
    return {"max_abs_difference": difference}


def run(method: str, device: str) -> dict[str, Any]:
    dev = torch.device(device)
    tiny = dev.type == "cpu"
    result: dict[str, Any] = {"method": method, "device": device, "torch": torch.__version__}
    if dev.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(dev)
        result["capability"] = list(torch.cuda.get_device_capability(dev))
    result["kernels"] = check_kernels(method, dev, TINY_SHAPES if tiny else SHAPES)
    with tempfile.TemporaryDirectory(prefix="diffuserve-quant-") as tmp:
        root = Path(tmp)
        sdar_config = make_config("sdar-moe-tiny", hidden_size=128, moe_intermediate_size=128, head_dim=32)
        sdar_config = sdar_config if tiny else make_config("sdar-moe-bench")
        sdar = write_random_checkpoint(root / "sdar", sdar_config, seed=0, logit_scale=3.5)
        clover_config = make_clover_moe_config(
            "clover-moe-tiny",
            hidden_size=128,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            head_dim=32,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
        )
        clover_config = clover_config if tiny else make_clover_moe_config("clover-moe-bench")
        clover_config["torch_dtype"] = "bfloat16"  # step 3 compares in the checkpoint's own dtype: equal logits
        clover = write_clover_moe_checkpoint(root / "clover", clover_config)
        output = 16 if tiny else 128
        result["engine"] = {d.name: check_engine(d, method, device, output) for d in (sdar, clover)}
        result["written_checkpoint"] = check_written_checkpoint(clover, method, device, root)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("method", choices=("fp8", "int4", "int8"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    result = run(ns.method, ns.device)
    text = json.dumps(result)
    if ns.out:
        Path(ns.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
