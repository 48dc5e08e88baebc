"""The engine's tokens/s and step phases on one concurrent workload, decoded several ways: greedy, sampled, with
logprobs, sampled with logprobs, with penalties, and the edit decoder (the cases a user's requests take through the
decoders; edit wants a block length above 1).

    python scripts/decode_cases.py --model clover-moe-tiny --concurrency 128 --block-length 1
    python scripts/decode_cases.py --engines plain overlapped --cases greedy logprobs --repeats 6

Each case: `--concurrency` requests of `--prompt-tokens` random tokens, `--output-tokens` each (the stop token
ignored), added at once to one engine and stepped to the end; a warm-up round, then `--repeats` rounds, the
fastest kept. With several `--engines` (engine options: `overlapped` makes outputs beside the next forward;
`final-only` is the plain engine with every request asking for its finished output only, as LLM.generate's), each
case runs on every engine, their rounds interleaved, and the rows carry the median and spread of the rounds too.
Prints a table, then a JSON line (`rows`: per case and engine, tokens/s and each step phase in microseconds per
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
from diffuserve.structured_outputs import StructuredOutputsParams

CASES: dict[str, dict[str, Any]] = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8),
    "logprobs": dict(temperature=0.0, logprobs=2),
    "sampled+logprobs": dict(temperature=0.8, logprobs=2),
    "penalties": dict(temperature=0.0, frequency_penalty=0.3, repetition_penalty=1.1),
    "edit": dict(temperature=0.0, decoder="edit"),
    "verified": dict(temperature=0.0, decoder="verified"),
    "auto": dict(temperature=0.0, decoder="auto"),
    "auto-sampled": dict(temperature=0.8, decoder="auto"),
    "grammar": dict(temperature=0.0, structured_outputs=StructuredOutputsParams(regex="[a-z ]{1,400}")),
    "grammar-sampled": dict(temperature=0.8, structured_outputs=StructuredOutputsParams(regex="[a-z ]{1,400}")),
}


ENGINES: dict[str, dict[str, Any]] = {"plain": {}, "overlapped": dict(overlap_outputs=True), "final-only": {}}
"""Engine options a case can be compared across."""


def request_options(engine: str) -> dict[str, Any]:
    """What an engine variant changes in every request instead: final-only asks for finished outputs only
    (imported here: `ab_commits.py --script` runs this script on revisions older than output kinds)."""
    if engine != "final-only":
        return {}
    from diffuserve.sampling_params import RequestOutputKind

    return dict(output_kind=RequestOutputKind.FINAL_ONLY)


def run_round(llm: LLM, prompts: list[list[int]], params: SamplingParams, tag: str) -> dict[str, Any]:
    """One round: every prompt added at once, stepped to the end -> tokens/s and phases per request-step."""
    engine = llm.engine
    engine.counters.phases = StepPhases()  # this round's only
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    wall = time.perf_counter() - started
    phases = engine.counters.phases.per_request_step_us()
    return {
        "tokens_per_s": round(len(prompts) * (params.max_tokens or 0) / wall, 1),
        "phases_us_per_request_step": {name: round(value, 1) for name, value in phases.items()},
    }


def run_case(llms: dict[str, LLM], prompts: list[list[int]], knobs: dict[str, Any], output_tokens: int, repeats: int):
    """The case on every engine, rounds interleaved (after a warm-up round each) -> per engine: the fastest round,
    with the median and the range of the rounds' tokens/s."""
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, **knobs)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in llms}
    for round_index in range(repeats + 1):
        for name, llm in llms.items():
            found = run_round(llm, prompts, params.replace(**request_options(name)), str(round_index))
            if round_index:
                rounds[name].append(found)
    best = {}
    for name, found in rounds.items():
        speeds = sorted(r["tokens_per_s"] for r in found)
        best[name] = max(found, key=lambda r: r["tokens_per_s"]) | {
            "median_tokens_per_s": speeds[len(speeds) // 2],
            "range_tokens_per_s": [speeds[0], speeds[-1]],
        }
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
    parser.add_argument("--engines", nargs="+", default=["plain"], choices=list(ENGINES))
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = str(prepare_model(args.model))
    llms = {
        name: LLM(model, max_num_seqs=args.concurrency, block_length=args.block_length, seed=0, **ENGINES[name])
        for name in args.engines
    }
    vocab = next(iter(llms.values())).engine.args.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(10, min(250, vocab)) for _ in range(args.prompt_tokens)] for _ in range(args.concurrency)]
    rows = []
    print(f"{'case':18} {'engine':11} {'tokens/s':>9}  phases (us per request-step)")
    for case in args.cases:
        for engine, result in run_case(llms, prompts, CASES[case], args.output_tokens, args.repeats).items():
            row = case if len(llms) == 1 else f"{case}, {engine}"
            rows.append({"row": row, **result})
            print(f"{case:18} {engine:11} {result['tokens_per_s']:9.1f}  {result['phases_us_per_request_step']}")
    line = json.dumps({"script": "decode_cases", "args": vars(args) | {"json_out": None}, "rows": rows})
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
