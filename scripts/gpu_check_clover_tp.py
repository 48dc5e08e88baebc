"""GPU check of tensor parallelism (run by `scripts/gpu_check.sh --clover --tensor-parallel-size N`): clover_moe over N
GPUs of one machine (NCCL; gloo on the CPU with --device cpu), through the public `LLM` API and `diffuserve bench`.

1. tokens: a random clover-moe-bench checkpoint (written here, seeded; 6 GDN + 2 gated attention layers, 16
   experts) in bf16, 16 mixed-length prompts at temperature 0: one GPU vs N ranks tensor parallel vs N ranks with
   whole experts per rank: the fraction of requests whose tokens equal one GPU's (bf16 all-reduces add in another
   order than one matmul, so a near tie can flip a token), and the largest difference of one prompt's logprobs;
2. per rank vs the planner: rank 0's parameter bytes, K/V bytes per token and state bytes per slot against
   `diffuserve plan DIR -tp N [-ep N] --json` (bf16 weights and K/V, exact for K/V and state);
3. throughput: `diffuserve bench throughput --tensor-parallel-size 1` and `N` (block 32, 1 and 16 concurrent,
   128 + 128 tokens): tokens/s and rank 0's all-reduce time per step (the collectives' cost).

`--device cpu` runs the same code over gloo on the CPU in fp32 at 1 and 2 concurrent, 32 + 32 tokens: the dry
run (pass --prompts 4 --max-tokens 8 to keep it short). The last line
printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.workload import BenchModel, prepare_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensor-parallel-size", type=int, default=2)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run, gloo)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.tensor_parallel_size:
        print(f"gpu_check_clover_tp: needs {args.tensor_parallel_size} GPUs", file=sys.stderr)
        return 2
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    start = time.monotonic()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    result: dict[str, Any] = {"device": args.device, "tensor_parallel_size": args.tensor_parallel_size}
    with tempfile.TemporaryDirectory(prefix="diffuserve-clover-tp-") as tmp:
        model_dir = prepare_model("clover-moe-bench", Path(tmp), BenchModel())
        result["tokens"] = _tokens(model_dir, args, dtype)
        result["throughput"] = _throughput(model_dir, args, dtype, Path(tmp))
    result["elapsed_s"] = round(time.monotonic() - start, 1)
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


def _prompts(count: int) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {"prompt_token_ids": torch.randint(10, 250, (8 + 13 * i,), generator=generator).tolist()} for i in range(count)
    ]


def _tokens(model_dir: Path, args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    prompts, params = _prompts(args.prompts), SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    options = dict(dtype=dtype, device=args.device, max_num_seqs=args.prompts)
    one = LLM(str(model_dir), **options)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params)]
    probe = prompts[-1]["prompt_token_ids"]
    reference = _prompt_logprobs(one, probe)
    del one
    report: dict[str, Any] = {}
    for name, expert_parallel in (("tp", False), ("tp+ep", True)):
        size = args.tensor_parallel_size
        llm = LLM(str(model_dir), tensor_parallel_size=size, enable_expert_parallel=expert_parallel, **options)
        try:
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            logprob_diff = (_prompt_logprobs(llm, probe) - reference).abs().max().item()
            report[name] = {
                "requests_with_equal_tokens": sum(a == b for a, b in zip(got, expected)) / len(expected),
                "max_prompt_logprob_diff": logprob_diff,
                "per_rank_vs_plan": _per_rank_vs_plan(llm, model_dir, size, expert_parallel, dtype),
            }
        finally:
            llm.engine.shutdown()
        print(f"tokens {name}: {report[name]}", flush=True)
    return report


def _prompt_logprobs(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """[P - 1] each prompt token's logprob given the ones before it (prompt scoring: one prefill's logits)."""
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    return torch.tensor([next(iter(p.values())).logprob for p in out.prompt_logprobs if p])


def _per_rank_vs_plan(llm: LLM, model_dir: Path, size: int, expert_parallel: bool, dtype: str) -> dict[str, Any]:
    executor = llm.engine.runner.executor
    kv = executor.caches.paged["kv"]
    state = executor.caches.state
    assert state is not None
    measured = {
        "weight_bytes": sum(p.numel() * p.element_size() for p in executor.model.parameters()),
        "kv_bytes_per_token": sum(t.numel() * t.element_size() for t in kv.k_caches + kv.v_caches)
        / (kv.num_pages * kv.page_size),
        "state_bytes_per_sequence": state.state_bytes_per_slot(),
    }
    weight = "bf16" if dtype == "bfloat16" else "fp32"
    command = [sys.executable, "-m", "diffuserve", "plan", str(model_dir), "-tp", str(size), "--json"]
    command += ["-ep", str(size)] if expert_parallel else []
    command += ["--weight-dtype", weight, "--kv-cache-dtype", weight]
    memory = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)["memory_per_device"]
    return {k: {"engine": v, "plan": memory[k], "ratio": v / memory[k]} for k, v in measured.items()}


def _throughput(model_dir: Path, args: argparse.Namespace, dtype: str, tmp: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for size in (1, args.tensor_parallel_size):
        out = tmp / f"throughput-tp{size}.json"
        command = [sys.executable, "-m", "diffuserve", "bench", "throughput", "--model", str(model_dir)]
        command += ["--tensor-parallel-size", str(size), "--device", args.device, "--dtype", dtype]
        sizes = ["1", "16", "--prompt-tokens", "128"] if args.device == "cuda" else ["1", "2", "--prompt-tokens", "32"]
        command += ["--concurrency", *sizes, "--output-tokens", sizes[-1], "--block-lengths", "32", "--sequential", "0"]
        command += ["--json-out", str(out)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        runs = json.loads(out.read_text())["results"]
        report[f"tp{size}"] = [
            {k: r[k] for k in ("concurrency", "tokens_per_s", "mean_decode_step_s", "comm_s_per_step")} for r in runs
        ]
        print(f"throughput tp{size}: {report[f'tp{size}']}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(main())
