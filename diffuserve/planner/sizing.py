"""Sizing for a request rate with Little's law: concurrency = arrival rate x end-to-end latency.

Owns the search for the smallest concurrency (and, if one replica is not enough, the number of replicas)
that serves a given request rate. Knows nothing of bytes or money: it calls the roofline's decode estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from diffuserve.planner.roofline import DecodeEstimate
from diffuserve.planner.units import fmt_time


@dataclass(frozen=True)
class RateSizing:
    request_rate: float
    concurrency_per_replica: int
    """Smallest concurrency at which the replicas keep up (the largest that fits if they cannot)."""
    e2e_latency_s: float
    replicas_needed: int
    gpus_needed: int
    formulas: tuple[str, ...]


def size_for_rate(
    request_rate: float,
    output_tokens: int,
    t_prefill: float,
    steps_to_first_block: int,
    max_concurrency: int,
    replicas: int,
    tensor_parallel_size: int,
    decode: Callable[[int], DecodeEstimate],
) -> RateSizing:
    """Each replica serves B / E2E(B) requests/s, with E2E = TTFT + output / (tokens/s per sequence)."""

    def latency(num_seqs: int) -> float:
        estimate = decode(num_seqs)
        ttft = t_prefill + steps_to_first_block * estimate.forward.t_forward
        return ttft + output_tokens / estimate.tokens_per_s_per_seq

    chosen = max_concurrency
    for num_seqs in range(1, max_concurrency + 1):
        if replicas * num_seqs / latency(num_seqs) >= request_rate:
            chosen = num_seqs
            break
    e2e = latency(chosen)
    per_replica_rate = chosen / e2e
    needed = max(replicas, math.ceil(request_rate / per_replica_rate - 1e-9))
    formulas = (
        f"Little's law: B = rate x E2E; E2E(B) = TTFT + {output_tokens} tokens / (tokens/s per sequence); "
        f"smallest B with {replicas} replica(s) x B / E2E(B) >= {request_rate}/s: B = {chosen}, "
        f"E2E = {fmt_time(e2e)}",
        f"replicas = ceil({request_rate}/s / ({chosen} / {fmt_time(e2e)} = {per_replica_rate:.3g}/s per "
        f"replica)) = {needed} -> {needed * tensor_parallel_size} GPU(s)",
    )
    return RateSizing(request_rate, chosen, e2e, needed, needed * tensor_parallel_size, formulas)
