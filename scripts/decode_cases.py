"""The engine's tokens/s and step phases on one concurrent workload, decoded several ways: greedy, sampled, with
logprobs, sampled with logprobs, with penalties, and the edit decoder (the cases a user's requests take through the
decoders; edit wants a block length above 1).

    python scripts/decode_cases.py --model clover-moe-tiny --concurrency 128 --block-length 1

Each case: `--concurrency` requests of `--prompt-tokens` random tokens, `--output-tokens` each (the stop token
ignored), added at once to one engine and stepped to the end; a warm-up round, then `--repeats` rounds, the
fastest kept. Prints a table, then a JSON line (`rows`: per case, tokens/s and each step phase in microseconds per
request-step, engine/step_phases.py). Imports the engine from the Python path, so `scripts/ab_commits.py
--script scripts/decode_cases.py` runs it on two revisions.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.workload import prepare_model
from diffuserve.engine.step_phases import StepPhases

CASES: dict[str, dict[str, Any]] = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8),
    "logprobs": dict(temperature=0.0, logprobs=2),
    "sampled+logprobs": dict(temperature=0.8, logprobs=2),
    "penalties": dict(temperature=0.0, frequency_penalty=0.3, repetition_penalty=1.1),
    "edit": dict(temperature=0.0, decoder="edit"),
    "auto": dict(temperature=0.0, decoder="auto"),
    "auto-sampled": dict(temperature=0.8, decoder="auto"),
}


def run_case(llm: LLM, prompts: list[list[int]], knobs: dict[str, Any], output_tokens: int, repeats: int) -> dict:
    """The case's fastest of `repeats` rounds (after a warm-up): tokens/s and phases per request-step."""
    engine = llm.engine
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, **knobs)
    best: dict[str, Any] | None = None
    for round_index in range(repeats + 1):
        engine.counters.phases = StepPhases()  # this round's only
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{round_index}-{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
        wall = time.perf_counter() - started
        found = {
            "tokens_per_s": round(len(prompts) * output_tokens / wall, 1),
            "phases_us_per_request_step": {
                name: round(value, 1) for name, value in engine.counters.phases.per_request_step_us().items()
            },
        }
        if round_index and (best is None or found["tokens_per_s"] > best["tokens_per_s"]):
            best = found
    assert best is not None
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="clover-moe-tiny", help="a model directory or a random shape's name")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--block-length", type=int, default=None, help="default: the model's")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--cases", nargs="+", default=list(CASES)[:5], choices=list(CASES), help="default: the first five"
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = prepare_model(args.model)
    llm = LLM(str(model), max_num_seqs=args.concurrency, block_length=args.block_length, seed=0)
    vocab = llm.engine.args.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(10, min(250, vocab)) for _ in range(args.prompt_tokens)] for _ in range(args.concurrency)]
    rows = []
    print(f"{'case':18} {'tokens/s':>9}  phases (us per request-step)")
    for name in args.cases:
        result = run_case(llm, prompts, CASES[name], args.output_tokens, args.repeats)
        rows.append({"row": name, **result})
        print(f"{name:18} {result['tokens_per_s']:9.1f}  {result['phases_us_per_request_step']}")
    line = json.dumps({"script": "decode_cases", "args": vars(args) | {"json_out": None}, "rows": rows})
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
