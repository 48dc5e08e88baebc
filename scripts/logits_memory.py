"""Peak host memory of DiffusionGemma's decode logits at high concurrency: one engine step per
denoising step over every canvas at once, on a random checkpoint of the published 262,144-token vocabulary and
256-position canvas with a tiny body (6 layers of hidden 32), so that the [rows, V] fp32 logits dominate.

    python scripts/logits_memory.py --dir /tmp/gemma-262k --requests 128 --budget-mib 1024     # chunked (default)
    python scripts/logits_memory.py --dir /tmp/gemma-262k --requests 4 8 --budget-mib 0       # one chunk (before)

Each (requests, budget) row runs in a fresh subprocess: it loads the model, resets the process's peak RSS
(/proc/self/clear_refs), generates one canvas of `--steps` denoising steps per request (all requests in the same
steps), and reports the peak RSS over the loaded baseline (VmHWM - VmRSS before). Budget 0 computes every row
of the step at once, as the runner did before its logits were chunked. One JSON line per row, then a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def write_model(out: Path, vocab: int, canvas: int) -> None:
    from diffuserve.reference.diffusion_gemma_checkpoint import (
        make_diffusion_gemma_config,
        write_diffusion_gemma_checkpoint,
    )

    config = make_diffusion_gemma_config(vocab_size=vocab, max_position_embeddings=4096)
    write_diffusion_gemma_checkpoint(out, {**config, "canvas_length": canvas}, seed=0, feedback=0.1)


def measure(model: str, requests: int, budget_mib: int, steps: int) -> dict:
    """One row, in this process (call it in a fresh one)."""
    import torch

    from diffuserve.llm import LLM
    from diffuserve.sampling_params import SamplingParams

    torch.set_num_threads(1)
    llm = LLM(model, max_num_seqs=requests, max_num_batched_tokens=requests * 256 + 256)
    runner = llm.engine.runner
    vocab = runner.decoding.vocab_size
    runner.logits_budget_bytes = budget_mib * MIB if budget_mib else 1 << 62
    prompts = [{"prompt_token_ids": [10 + i % 50, 11, 12, 13]} for i in range(requests)]
    params = SamplingParams(max_tokens=runner.block_length, seed=1, steps=steps, ignore_eos=True)
    baseline = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from here
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") - baseline
    assert all(len(o.outputs[0].token_ids) == runner.block_length for o in outputs)
    rows = max(runner.block_length, (budget_mib * MIB) // (4 * vocab)) if budget_mib else requests * 256
    return dict(
        requests=requests,
        budget_mib=budget_mib,
        vocab=vocab,
        canvas=runner.block_length,
        steps=steps,
        rows_per_chunk=min(rows, requests * runner.block_length),
        peak_over_baseline_mib=round(peak / 1024),
        baseline_rss_mib=round(baseline / 1024),
        seconds=round(seconds, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the checkpoint directory (written if absent)")
    parser.add_argument("--requests", type=int, nargs="+", default=[128])
    parser.add_argument("--budget-mib", type=int, nargs="+", default=[1024], help="0: every row at once (before)")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per canvas (2: one self-conditioning)")
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a row's subprocess
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.dir, args.requests[0], args.budget_mib[0], args.steps)))
        return
    if not (Path(args.dir) / "config.json").exists():
        write_model(Path(args.dir), args.vocab, args.canvas)
    rows = []
    for requests in args.requests:
        for budget in args.budget_mib:
            command = [sys.executable, __file__, "--one", "--dir", args.dir, "--steps", str(args.steps)]
            command += ["--requests", str(requests), "--budget-mib", str(budget)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
