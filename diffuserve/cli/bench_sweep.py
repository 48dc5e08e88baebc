"""`diffuserve bench sweep`'s arguments (the engine against its family's batched peer; diffuserve/bench/sweep.py
runs it): concurrency levels, workloads, readings, sizes and profiling. Parsing only; imports no torch."""

from __future__ import annotations

import argparse

from diffuserve.cli.arg_types import non_negative_float, positive_int


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 16, 64, 128],
        help="concurrent requests per row (default: 1 16 64 128)",
    )
    parser.add_argument(
        "--workload",
        nargs="+",
        default=["best-case", "realistic"],
        choices=("best-case", "realistic"),
        help="best-case: equal prompts and outputs, no stops, all at once; realistic: mixed lengths, stop tokens, "
        "Poisson arrivals, a quarter long RL-rollout outputs (default: both)",
    )
    parser.add_argument(
        "--readings",
        nargs="+",
        default=None,
        choices=("diffusion", "ar"),
        help="which of the family's readings to run (clover_moe has ar and diffusion; default: all)",
    )
    parser.add_argument("--prompt-tokens", type=positive_int, default=64, help="longest prompt (default: 64)")
    parser.add_argument("--output-tokens", type=positive_int, default=64, help="longest output (default: 64)")
    parser.add_argument(
        "--arrival-window",
        type=non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="realistic workload: arrivals are Poisson at concurrency / SECONDS per second (default: 1.0)",
    )
    parser.add_argument(
        "--denoising-steps",
        type=positive_int,
        default=None,
        help="renoise canvases (DiffusionGemma): max_denoising_steps (default: the model's)",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=positive_int,
        default=None,
        help="the engine's prefill tokens per step (default: the engine's default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the workloads (default: 0)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the engine's steps (cProfile) on the realistic workload at the largest concurrency",
    )
