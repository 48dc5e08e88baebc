"""GDN's one-token delta rule at a decode step's shape: the engine's `recurrent_delta_rule` (batched matmuls of
[1, Dk] rows, the rank-1 write in place) against the `einsum` form it replaced at git e66cb12, written out here as
it was. Same inputs, fixed seed, one warm-up, the two forms interleaved, the median of the repeats; prints a table
and one JSON line (`render_docs.py --record delta-rule-decode`).

    python scripts/delta_rule_speed.py --sequences 128 --heads 8 --dim 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffuserve.model.families.clover_moe.delta_rule import recurrent_delta_rule

Rule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def einsum_rule(q, k, v, g, beta, state):
    """The one-token rule before e66cb12: each read an einsum over the whole state, the write a broadcast sum."""
    out = torch.empty_like(v)
    for t in range(q.shape[2]):
        state = state * g[:, :, t, None, None].exp()
        read = torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        update = (v[:, :, t] - read) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * update[:, :, None, :]
        out[:, :, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, :, t])
    return out, state


def inputs(sequences: int, heads: int, dim: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(sequences, heads, 1, dim, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(sequences, heads, 1, dim, generator=gen)
    g, beta = -torch.rand(sequences, heads, 1, generator=gen), torch.rand(sequences, heads, 1, generator=gen)
    return q * dim**-0.5, k, v, g, beta, torch.randn(sequences, heads, dim, dim, generator=gen)


def seconds(rule: Rule, args: tuple[torch.Tensor, ...]) -> float:
    started = time.perf_counter()
    rule(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    args = inputs(ns.sequences, ns.heads, ns.dim)
    rules: dict[str, Rule] = {"einsum (before)": einsum_rule, "batched matmuls (now)": recurrent_delta_rule}
    times: dict[str, list[float]] = {name: [] for name in rules}
    for rule in rules.values():
        rule(*args)  # warm-up
    for _ in range(ns.repeats):
        for name, rule in rules.items():
            times[name].append(seconds(rule, args))
    medians = {name: statistics.median(values) for name, values in times.items()}
    (o_before, s_before), (o_now, s_now) = (rule(*args) for rule in rules.values())
    difference = max((o_now - o_before).abs().max().item(), (s_now - s_before).abs().max().item())
    for name, median in medians.items():
        print(f"{name:<24} {1e3 * median:8.3f} ms")
    speedup = medians["einsum (before)"] / medians["batched matmuls (now)"]
    print(f"speed-up {speedup:.2f}x, largest difference {difference:.3g}")
    shape = [ns.sequences, ns.heads, ns.dim, ns.dim]
    record = {"state_shape": shape, "repeats": ns.repeats, "threads": ns.threads, "median_ms": {}}
    record["median_ms"] = {name: 1e3 * median for name, median in medians.items()}
    print(json.dumps(record | {"speedup": speedup, "max_abs_difference": difference, "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
