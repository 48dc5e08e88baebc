"""CPU milliseconds per generated token at two git revisions, interleaved: an A/B that other load cannot skew.

    python scripts/ab_cpu_time.py --old 230d40c --new HEAD --model sdar-moe-bench --concurrency 1 16 64

`scripts/ab_commits.py` compares wall-clock tokens/s, which on a shared 2-core machine moves 2-4x with other
agents' load. This compares the engine's own CPU time instead: each revision is checked out once (a detached
`git worktree`), and a fresh process per (revision, concurrency) runs `LLM.generate` on one thread over fixed
prompts of ordinary token ids (300 to 4,299, or from 10 on in a smaller vocabulary; temperature 0, `ignore_eos`,
so both sides generate the same number of tokens), once to warm up and then --repeats times, reporting
`time.process_time()` per generated token. Runs go old, new, new, old, ... The table prints the best of each
side's repeats (the least disturbed), and new / old; the last line is JSON. CPU time is not immune to load
(shared caches and memory bandwidth), only far less moved by it.

Knows nothing of the engine beyond the public `LLM` / `SamplingParams` API that both revisions share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_commits import checkout

CHILD = """
import json, sys, time, torch
torch.set_num_threads(1)
from diffuserve import LLM, SamplingParams
model_dir, concurrency, repeats, prompt_tokens, output_tokens = sys.argv[1:6]
llm = LLM(model_dir)
vocab = llm.engine.args.vocab_size  # ids 300-4299 where the vocabulary holds them (the recorded runs'), else 10 on
first, span = (300, 4000) if vocab >= 4300 else (10, vocab - 10)
prompts = [{"prompt_token_ids": [(7 * i + j) % span + first for j in range(int(prompt_tokens))]}
           for i in range(int(concurrency))]
params = SamplingParams(max_tokens=int(output_tokens), temperature=0.0, ignore_eos=True)
def cpu_ms_per_token():
    start = time.process_time()
    outputs = llm.generate(prompts, params)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return (time.process_time() - start) * 1000 / tokens
cpu_ms_per_token()
print(json.dumps([cpu_ms_per_token() for _ in range(int(repeats))]))
"""


def bench_model_dir(tree: Path, model: str) -> Path:
    """The bench model's checkpoint directory, written by `tree`'s own `bench` code if it is not cached yet."""
    name = None if model == "sdar-moe-bench" else model  # the bench's default model has no preset name
    code = f"from diffuserve.bench.workload import prepare_model; print(prepare_model({name!r}))"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, check=True)
    return Path(found.stdout.strip().splitlines()[-1])


def measure(tree: Path, model_dir: Path, concurrency: int, args: argparse.Namespace) -> list[float]:
    """CPU ms per token of each repeat, in a fresh process running `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", CHILD, str(model_dir), str(concurrency), str(args.repeats)]
    command += [str(args.prompt_tokens), str(args.output_tokens)]
    done = subprocess.run(command, cwd=tree, env=env, text=True, capture_output=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--model", default="sdar-moe-bench")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "diffuserve-ab")
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    trees = {"old": checkout(args.old, args.work_dir), "new": checkout(args.new, args.work_dir)}
    model_dir = bench_model_dir(trees["new"], args.model)
    samples: dict[tuple[str, int], list[float]] = {}
    for i in range(args.rounds):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            for concurrency in args.concurrency:
                samples.setdefault((side, concurrency), []).extend(measure(trees[side], model_dir, concurrency, args))
    print(f"{'concurrency':>11} {'old ms/tok':>10} {'new ms/tok':>10} {'new/old':>8}")
    table = []
    for concurrency in args.concurrency:
        old, new = (min(samples[(side, concurrency)]) for side in ("old", "new"))
        table.append({"concurrency": concurrency, "old_cpu_ms": old, "new_cpu_ms": new, "ratio": round(new / old, 3)})
        print(f"{concurrency:>11} {old:10.2f} {new:10.2f} {new / old:8.3f}")
    revisions = {side: tree.name for side, tree in trees.items()}
    print(json.dumps({"model": args.model, "revisions": revisions, "rounds": args.rounds, "rows": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
