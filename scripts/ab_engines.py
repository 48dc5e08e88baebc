"""Engine configurations side by side in one process: each CONFIG (dtype:moe_backend:eager|compiled) gets its own
engine on the benchmark model, one warm-up request (its compile time, if any, reported and not timed), then the
configurations decode the same prompt in interleaved rounds (a, b, c, a, b, c, ...) so that the machine's load
hits them alike. Prints a table and a final JSON line (`render_docs.py --record` keeps it).

    python scripts/ab_engines.py float32:loop:eager bfloat16:loop:eager float32:bmm:eager bfloat16:bmm:eager
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import torch

from diffuserve.bench.context import make_context, max_model_len
from diffuserve.bench.engine_run import run_requests
from diffuserve.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", metavar="DTYPE:BACKEND:eager|compiled")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128, help="prompt and output tokens (default: 128)")
    ns = parser.parse_args()
    ctx = make_context(
        argparse.Namespace(
            threads=ns.threads,
            model=None,
            model_cache_dir=None,
            model_seed=0,
            logit_scale=3.5,
            dtype="float32",
            device="cpu",
            probe_seconds=0.5,
            seed=0,
        )
    )
    params = SamplingParams(max_tokens=ns.tokens, ignore_eos=True, temperature=0.0)
    warm, measured = ctx.prompts(2, ns.tokens)
    runs = []
    for config in ns.configs:
        dtype, backend, mode = config.split(":")
        engine = dataclasses.replace(ctx, dtype=dtype).engine(
            ns.block_length,
            1,
            max_model_len(ns.tokens, ns.tokens, ns.block_length),
            enable_prefix_caching=False,
            moe_backend=backend,
            enforce_eager=mode == "eager",
        )
        started = time.perf_counter()
        run_requests(engine, [warm], params.replace(max_tokens=2 * ns.block_length))
        runs.append({"config": config, "engine": engine, "warm_up_s": time.perf_counter() - started, "walls": []})
    for _ in range(ns.rounds):
        for run in runs:
            record = run_requests(run["engine"], [measured], params)
            run["walls"].append(record.wall_s)
            run["tokens"], run["nfe"] = record.outputs[0].outputs[0].token_ids, record.num_forwards
    first = runs[0]
    results = [
        {
            "config": r["config"],
            "tokens_per_s": ns.tokens / statistics.median(r["walls"]),
            "forwards_per_s": r["nfe"] / statistics.median(r["walls"]),
            "nfe": r["nfe"],
            "warm_up_s": r["warm_up_s"],
            "wall_s_rounds": r["walls"],
            "same_tokens_as_first": r["tokens"] == first["tokens"],
        }
        for r in runs
    ]
    for r in results:
        print(
            f"{r['config']:<28} {r['tokens_per_s']:7.1f} tok/s {r['forwards_per_s']:6.2f} fwd/s NFE {r['nfe']:4d} "
            f"x first {r['tokens_per_s'] / results[0]['tokens_per_s']:.2f} same tokens {r['same_tokens_as_first']}"
        )
    print(
        json.dumps(
            {
                "bench": "ab_engines",
                "threads": ns.threads,
                "rounds": ns.rounds,
                "torch": torch.__version__,
                "probe": ctx.rates.to_json(),
                "load_average": list(os.getloadavg()),
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
