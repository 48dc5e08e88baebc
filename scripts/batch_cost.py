"""The batch phase alone (`ModelRunner.build_batch`: token ids, positions, each page group's key slots and masks,
the decoding plan) for many running requests at a given context length, without a forward: how the engine's own
step work grows with the requests' context.

    python scripts/batch_cost.py --model sdar-moe-tiny --requests 128 --contexts 64 2048 32768

Each context: `--requests` requests whose prompt holds that many tokens, each step committing its last block and
computing the next (a block-diffusion decode step, fused commit), their page tables growing by a page when a block
crosses one, for `--steps` steps after a warm-up; `--repeats` rounds, the fastest kept. No forward runs, so the
context is not bounded by the model's positions. Prints a table, then a JSON line (`rows`: per context,
request-steps built per second and microseconds per request-step). Imports the engine from the Python path, so
`scripts/ab_commits.py --script scripts/batch_cost.py` runs it on two revisions.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.workload import prepare_model
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest


def running_requests(llm: LLM, count: int, context: int, steps: int) -> list[Request]:
    """`count` requests at their first block after a `context`-token prompt (prompts long enough for `steps`
    blocks more, whose tokens the fused commits read), each holding the pages up to its block."""
    engine = llm.engine
    block, page_size = engine.runner.block_length, engine.cache.page_size
    start = -(-context // block) * block
    params = SamplingParams(max_tokens=block).with_defaults({})
    rng = random.Random(0)
    requests = []
    for i in range(count):
        request = Request(f"r{i}", [1] * (start + (steps + 1) * block + 1), params, block, engine.args.mask_token_id)
        request.block_start = start
        request.pages = {
            group: [rng.randrange(1000) for _ in range(-(-(start + block) // page_size))]
            for group in ["kv", *engine.runner.executor.sizes.windows]
        }
        requests.append(request)
    return requests


def advance(requests: list[Request], page_size: int) -> list[ScheduledRequest]:
    """Every request moves on a block (its pages growing to hold it) -> the step's work: commit the last block,
    compute the next."""
    work = []
    for request in requests:
        request.block_start += request.block_length
        for pages in request.pages.values():
            if len(pages) * page_size < request.block_end:
                pages.append(len(pages) % 1000)  # in place, as the cache's allocation appends
        work.append(ScheduledRequest(request, request.block_start - request.block_length, request.block_start, True))
    return work


def time_context(llm: LLM, count: int, context: int, steps: int, repeats: int) -> float:
    """Seconds per request-step of building the batch, the fastest of `repeats` rounds (after a warm-up)."""
    runner, page_size = llm.engine.runner, llm.engine.cache.page_size
    best = float("inf")
    for round_index in range(repeats + 1):
        requests = running_requests(llm, count, context, steps)
        elapsed = 0.0
        for _ in range(steps):
            scheduled = advance(requests, page_size)
            started = time.perf_counter()
            runner.build_batch(scheduled)
            elapsed += time.perf_counter() - started
        for request in requests:
            runner.release(request.request_id)
        if round_index:
            best = min(best, elapsed / (steps * count))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sdar-moe-tiny", help="a model directory or a random shape's name")
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 2048, 32768])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(str(prepare_model(args.model)), max_num_seqs=args.requests, seed=0)
    assert not llm.engine.runner.has_state, "a model without recurrent state (its slots are not made here)"
    rows = []
    print(f"{'context':>8} {'us per request-step':>20} {'request-steps/s':>16}")
    for context in args.contexts:
        seconds = time_context(llm, args.requests, context, args.steps, args.repeats)
        rows.append({"row": f"context {context}", "request_steps_per_s": round(1 / seconds, 1), "us": seconds * 1e6})
        print(f"{context:8d} {seconds * 1e6:20.1f} {1 / seconds:16.0f}")
    line = json.dumps(
        {"script": "batch_cost", "args": vars(args) | {"json_out": None}, "rate": "request_steps_per_s", "rows": rows}
    )
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
