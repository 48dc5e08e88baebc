"""GPU check of the compiled forward (run by `scripts/gpu_check.sh --compiled`): the engine eager against the
engine compiled as CUDA runs it by default (`mode="reduce-overhead"`: CUDA graphs of the pieces between the graph
breaks at attention and the routed experts, the step padded to bucket sizes; worker/executor.py), on a random
`sdar-moe-bench` checkpoint in bf16.

1. warm-up: one request through each engine; the compiled one's compile time (`compile_s`);
2. mixed batches (1 to 16 requests, prompts of 8 to 300 tokens, 48 output tokens, temperature 0) through both:
   whether the tokens are equal, and dynamo's counters after the warm-up (recompiles must stay at 0; graphs and
   CUDA-graph recordings must stop growing once every bucket has been seen);
3. decode speed at 1 and 16 concurrent requests (128 prompt / 128 output tokens), eager vs compiled.

Reported, never asserted: bf16 kernels fused by inductor may round differently from eager. `--device cpu` runs
the same code with inductor on the CPU and bucketing forced on (the dry run of the script itself). The last line
printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from diffuserve import LLM, SamplingParams
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.worker.executor import CompiledForward


def _engine(model_dir: Path, device: str, compiled: bool) -> LLM:
    llm = LLM(str(model_dir), dtype="bfloat16", device=device, enforce_eager=not compiled, max_num_seqs=16)
    executor = llm.engine.runner.executor
    if compiled and device == "cpu":  # the dry run exercises the CUDA path's padding too
        executor.run_model = CompiledForward(executor.model, True, torch.device("cpu"), bucketed=True)
    return llm


def _tokens(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], time.perf_counter() - started


def _mixed_batches(seed: int = 0) -> list[list[list[int]]]:
    rng = random.Random(seed)
    sizes = (1, 3, 8, 16, 5, 2, 12)
    return [[[rng.randrange(300, 8000) for _ in range(rng.randrange(8, 300))] for _ in range(n)] for n in sizes]


def _dynamo_counters() -> dict[str, Any]:
    keep = ("stats", "frames", "inductor")
    return {group: dict(counters[group]) for group in keep if group in counters}


def run(device: str) -> dict[str, Any]:
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="diffuserve-compiled-") as tmp:
        model_dir = write_random_checkpoint(Path(tmp) / "m", make_config("sdar-moe-bench"), seed=0, logit_scale=3.5)
        eager, compiled = _engine(model_dir, device, False), _engine(model_dir, device, True)
        warm = [list(range(300, 364))]
        _tokens(eager, warm, 32)
        _tokens(compiled, warm, 32)
        result["compile_s"] = compiled.engine.runner.executor.run_model.compile_s
        result["counters_after_warm_up"] = _dynamo_counters()
        same = [_tokens(eager, b, 48)[0] == _tokens(compiled, b, 48)[0] for b in _mixed_batches()]
        result["mixed_batches_same_tokens"] = same
        result["counters_after_mixed"] = _dynamo_counters()
        for batch in (1, 16):
            prompts = [[random.Random(i).randrange(300, 8000) for _ in range(128)] for i in range(batch)]
            times = {name: _tokens(llm, prompts, 128)[1] for name, llm in (("eager", eager), ("compiled", compiled))}
            result[f"batch_{batch}_tokens_per_s"] = {k: batch * 128 / v for k, v in times.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    line = json.dumps(run(args.device))
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
