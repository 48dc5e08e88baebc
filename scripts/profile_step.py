"""Profiles the engine decoding one request of the benchmark model (batch 1) and prints the top operators by self
CPU time and their calls per forward, as a human table and a final JSON line (`render_docs.py --record` keeps it).

    python scripts/profile_step.py --dtype float32 --moe-backend loop --threads 1     # the plain fp32 loop path
    python scripts/profile_step.py --dtype bfloat16 --threads 1                       # the default fast path
    python scripts/profile_step.py --model clover-moe-bench --threads 1               # the hybrid model

One warm-up request, then one profiled request (128 prompt / 128 output tokens, block 32, temperature 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch

from diffuserve.bench.context import make_context, max_model_len
from diffuserve.bench.engine_run import run_requests
from diffuserve.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--moe-backend", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--model", default=None, help="a model directory or clover-moe-bench (default: sdar-moe-bench)")
    ns = parser.parse_args()
    context_ns = argparse.Namespace(
        threads=ns.threads,
        model=ns.model,
        model_cache_dir=None,
        model_seed=0,
        logit_scale=3.5,
        dtype=ns.dtype,
        device="cpu",
        probe_seconds=0.2,
        seed=0,
    )
    ctx = make_context(context_ns)
    ctx = dataclasses.replace(
        ctx, engine_options={"moe_backend": ns.moe_backend, "enforce_eager": True if ns.enforce_eager else None}
    )
    engine = ctx.engine(ns.block_length, 1, max_model_len(128, 128, ns.block_length), enable_prefix_caching=False)
    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0)
    warm, measured = ctx.prompts(2, 128)
    run_requests(engine, [warm], params.replace(max_tokens=2 * ns.block_length))
    with torch.profiler.profile() as profile:
        record = run_requests(engine, [measured], params)
    events = sorted(profile.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in events)
    forwards = record.num_forwards
    ops = [
        {
            "op": e.key,
            "self_share": e.self_cpu_time_total / total_us,
            "calls_per_forward": e.count / forwards,
            "self_ms_per_forward": e.self_cpu_time_total / 1000 / forwards,
        }
        for e in events[: ns.top]
    ]
    for op in ops:
        print(
            f"{op['op']:<55} {100 * op['self_share']:5.1f}% {op['calls_per_forward']:8.1f} calls/fwd "
            f"{op['self_ms_per_forward']:7.2f} ms/fwd"
        )
    calls = sum(e.count for e in events) / forwards
    print(f"{forwards} forwards, {1000 * record.wall_s / forwards:.1f} ms each (profiled), {calls:.0f} ops/forward")
    print(
        json.dumps(
            {
                "bench": "profile",
                "dtype": ns.dtype,
                "moe_backend": ns.moe_backend,
                "threads": ns.threads,
                "forwards": forwards,
                "wall_ms_per_forward": 1000 * record.wall_s / forwards,
                "ops_per_forward": calls,
                "top_ops": ops,
                "load_average": list(os.getloadavg()),
            }
        )
    )


if __name__ == "__main__":
    main()
