"""One request of 131,072 tokens (prompt + output) end to end through a tiny clover_moe whose
max_position_embeddings is 131,072: chunked prefill (8K-token chunks), then decoding, once with bf16 K/V and once
with fp8 K/V (`--kv-cache-dtype fp8`), each run in its own process.

Per run: the time of each prefill chunk as the context grows (the GDN layers' work is constant per chunk, the
attention layers' grows with the keys a chunk attends), the decode steps at full context, the engine's K/V + state
bytes of the request at the end against the planner's figure for the same model and context
(`diffuserve plan DIR --context-length 131072 --kv-cache-dtype ...`), and the process's peak RSS. The last line
printed is the JSON summary (docs/benchmarks/latency.md, "128K end to end").

    python scripts/long_context.py [--context 131072] [--chunk 8192] [--output-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KV_DTYPES = ("auto", "fp8")
"""auto: the model's bf16."""


def write_model(root: Path, context: int) -> Path:
    from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

    config = make_clover_moe_config(max_position_embeddings=context, torch_dtype="bfloat16")
    return write_clover_moe_checkpoint(root / "clover-tiny-128k", config, seed=0, init_std=0.1, logit_scale=20.0)


def planned(model_dir: Path, context: int, kv_dtype: str) -> dict[str, float]:
    command = [sys.executable, "-m", "diffuserve", "plan", str(model_dir), "--context-length", str(context)]
    done = subprocess.run(
        [*command, "--kv-cache-dtype", kv_dtype, "--json"], capture_output=True, text=True, check=True
    )
    capacity = json.loads(done.stdout)["capacity"]
    return {"kv": capacity["kv_bytes_per_sequence"], "state": capacity["state_bytes_per_sequence"]}


def run_child(model_dir: Path, kv_cache_dtype: str, ns: argparse.Namespace) -> dict[str, Any]:
    """One request through a fresh engine: every step timed, the request's cache bytes read before it ends."""
    import torch

    from diffuserve import LLM, SamplingParams

    torch.set_num_threads(ns.threads)
    page_size = 16
    llm = LLM(
        str(model_dir),
        max_model_len=ns.context,
        max_num_seqs=1,
        max_num_batched_tokens=ns.chunk,
        num_pages=ns.context // page_size + 4,
        page_size=page_size,
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=False,
    )
    engine, executor = llm.engine, llm.engine.runner.executor
    prompt_len = ns.context - ns.output_tokens
    prompt = [(i * 7919) % 240 + 10 for i in range(prompt_len)]  # byte tokens, clear of the special ids
    params = SamplingParams(temperature=0.0, max_tokens=ns.output_tokens, ignore_eos=True)
    engine.add_request("long", prompt, params)
    request = engine.scheduler.requests["long"]
    kv = executor.caches.paged["kv"]
    kv_per_token = kv.num_bytes // (executor.sizes.num_pages * executor.page_size)
    chunks, decode_steps, cache_bytes, tokens = [], [], {}, []
    while engine.has_unfinished_requests():
        before = request.num_computed_tokens
        started = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - started
        if before < prompt_len:
            chunks.append({"context_end": request.num_computed_tokens, "seconds": seconds})
        else:
            decode_steps.append(seconds)
        if request.num_computed_tokens + ns.output_tokens >= ns.context or not cache_bytes:
            cache_bytes = {
                "kv": len(request.pages["kv"]) * page_size * kv_per_token,
                "state": executor.caches.state.state_bytes_per_slot(),
            }
        for out in outputs:
            tokens = list(out.outputs[0].token_ids)
        print(f"{kv_cache_dtype}: step {seconds:7.2f} s, computed {request.num_computed_tokens}", flush=True)
    return {
        "kv_cache_dtype": kv_cache_dtype,
        "cache_dtype": str(kv.k_caches[0].dtype).removeprefix("torch."),
        "prompt_tokens": prompt_len,
        "output_tokens": len(tokens),
        "chunks": chunks,
        "decode_steps": len(decode_steps),
        "decode_mean_s": sum(decode_steps) / max(len(decode_steps), 1),
        "engine_bytes": cache_bytes,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "tokens": tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the model is written (default: a temporary directory)")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child is not None:
        print(json.dumps(run_child(Path(ns.child[0]), ns.child[1], ns)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(ns.dir or tmp), ns.context)
        runs = []
        for kv_dtype in KV_DTYPES:
            flags = ["--context", str(ns.context), "--chunk", str(ns.chunk), "--threads", str(ns.threads)]
            child = [sys.executable, __file__, *flags, "--output-tokens", str(ns.output_tokens)]
            done = subprocess.run([*child, "--child", str(model_dir), kv_dtype], capture_output=True, text=True)
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                return done.returncode
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["planned_bytes"] = planned(model_dir, ns.context, "bf16" if kv_dtype == "auto" else kv_dtype)
            runs.append(run)
    same = sum(a == b for a, b in zip(runs[0]["tokens"], runs[1]["tokens"]))
    summary = {
        "context": ns.context,
        "chunk": ns.chunk,
        "threads": ns.threads,
        "same_output_tokens": same,
        "runs": runs,
    }
    for run in runs:
        engine = run["engine_bytes"]["kv"] + run["engine_bytes"]["state"]
        plan = run["planned_bytes"]["kv"] + run["planned_bytes"]["state"]
        print(
            f"{run['cache_dtype']:>14}: prefill {sum(c['seconds'] for c in run['chunks']):7.1f} s in "
            f"{len(run['chunks'])} chunks, decode {1e3 * run['decode_mean_s']:.1f} ms/step, K/V + state "
            f"{engine / 2**20:.2f} MiB (planned {plan / 2**20:.2f}), peak RSS {run['peak_rss'] / 2**30:.2f} GiB"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
