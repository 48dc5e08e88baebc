"""Trains the bundled default model (a tiny Clover, `clover_moe`) on the synthetic tasks, on CPU, from scratch.

    python scripts/train_tiny_model.py                       # writes diffuserve/assets/default-model
    python scripts/train_tiny_model.py --out /tmp/model      # anywhere else
    python scripts/train_tiny_model.py --family sdar --out /tmp/sdar   # the SDAR-MoE-shaped model bundled before

Deterministic: a fixed seed and a fixed number of steps (not a time budget), so two runs with the same
arguments and thread count write the same weights. Prints progress, then the held-out exact-match accuracy
of the written checkpoint at its default decoding, served by the engine, and a final JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

# NOTE: set before torch loads OpenMP. Spinning workers stall badly when the cores are shared (a CI runner, a
# busy laptop): one descheduled thread makes the other spin, and a step takes several times longer.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "diffuserve" / "assets" / "default-model"
# The trainer lives beside this script (scripts/training), not in the package: importable from the repository root.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from scripts.training.train import FAMILIES, TrainConfig

    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=list(FAMILIES), default=defaults.family, help="model family to train")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimiser steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="examples per step")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument(
        "--next-token-weight",
        type=float,
        default=defaults.next_token_weight,
        help="weight of the next-token loss beside the diffusion loss",
    )
    parser.add_argument(
        "--init-from",
        default=None,
        help="checkpoint directory to start from instead of the seeded init (continued training)",
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=defaults.warmup_steps, help="steps of linear learning-rate warm-up"
    )
    parser.add_argument("--log-every", type=int, default=defaults.log_every, help="steps between progress lines")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of data, noise and init")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (part of what makes runs repeat; 1 is robust on shared cores)",
    )
    parser.add_argument("--eval-per-task", type=int, default=200, help="held-out examples per task to score")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from diffuserve import LLM
    from diffuserve.eval.harness import evaluate, format_table
    from diffuserve.eval.tasks import heldout_examples
    from diffuserve.sampling_params import SamplingParams
    from scripts.training.train import FAMILIES, TrainConfig, train, write_checkpoint

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # denormal gradients late in training slow CPU kernels down many times
    cfg = TrainConfig(
        family=args.family,
        shape=dict(FAMILIES[args.family].shape),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        next_token_weight=args.next_token_weight,
        seed=args.seed,
        log_every=args.log_every,
        warmup_steps=args.warmup_steps,
        init_from=args.init_from,
    )
    start, start_cpu = time.perf_counter(), time.process_time()
    model_args, model = train(cfg, log=lambda line: print(line, flush=True))
    train_seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    out = write_checkpoint(model, model_args, cfg, args.out)
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {out} ({num_params / 1e6:.2f}M parameters) after {train_seconds:.0f}s of training "
        f"({cpu_seconds:.0f} CPU-seconds over {args.threads} threads)"
    )
    result = evaluate(LLM(str(out), dtype="float32"), heldout_examples(args.eval_per_task), SamplingParams(), "default")
    print(format_table([result]))
    summary = {
        "family": cfg.family,
        "train_seconds": round(train_seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "steps": cfg.steps,
        "seed": cfg.seed,
        "threads": args.threads,
        "params": num_params,
        **result.summary(),
        "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
