"""The requests of `diffuserve bench sweep`: two seeded workloads at a given concurrency.

- best-case (the static batcher's best case): every prompt --prompt-tokens long, every output --output-tokens long,
  no stop tokens, all arriving together at t = 0.
- realistic: prompt lengths drawn uniformly from [prompt_tokens / 4, prompt_tokens]; a quarter of the requests are
  RL rollouts with the longest outputs (--output-tokens), the rest ask for [output_tokens / 8, output_tokens / 2];
  every request stops at one of STOP_COUNT seeded stop token ids (the same set for all: one batch of a static
  batcher can only share one); arrivals are a Poisson process of rate concurrency / arrival_window (the first at
  t = 0), so the last one comes about arrival_window seconds in.

Request i's prompt and lengths are the same whatever the concurrency (its own seeded generator), so a larger sweep
point extends a smaller one; only the arrival rate scales with the concurrency. Knows nothing of engines or peers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORKLOADS = ("best-case", "realistic")
STOP_COUNT = 2
"""Stop token ids of the realistic workload (a random model hits one of 2 ids in a 320-token vocabulary in about a
third of 64-token outputs: some requests stop early, most do not)."""
ROLLOUT_SHARE = 4
"""One request in ROLLOUT_SHARE is an RL rollout (the longest output)."""


@dataclass(frozen=True)
class SweepRequest:
    prompt: list[int]
    max_tokens: int
    arrival_s: float
    """Seconds after the run's start at which the request arrives."""
    stop_token_ids: tuple[int, ...] = ()


def make_workload(
    kind: str,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    allowed: list[int],
    seed: int,
    arrival_window: float = 1.0,
) -> list[SweepRequest]:
    """`concurrency` requests of workload `kind`; prompt tokens are drawn from `allowed` (no mask, EOS or pad id)."""
    if kind not in WORKLOADS:
        raise ValueError(f"workload: {kind!r} is unknown; choose from {', '.join(WORKLOADS)}")
    if kind == "best-case":
        return [
            SweepRequest(random.Random(f"{seed}:prompt:{i}").choices(allowed, k=prompt_tokens), output_tokens, 0.0)
            for i in range(concurrency)
        ]
    stops = tuple(random.Random(f"{seed}:stops").sample(allowed, STOP_COUNT))
    prompt_pool = [t for t in allowed if t not in stops]
    arrivals = random.Random(f"{seed}:arrivals")
    requests, clock = [], 0.0
    for i in range(concurrency):
        rng = random.Random(f"{seed}:request:{i}")
        length = rng.randint(max(1, prompt_tokens // 4), prompt_tokens)
        rollout = i % ROLLOUT_SHARE == ROLLOUT_SHARE - 1
        outputs = output_tokens if rollout else rng.randint(max(1, output_tokens // 8), max(1, output_tokens // 2))
        requests.append(SweepRequest(rng.choices(prompt_pool, k=length), outputs, clock, stops))
        clock += arrivals.expovariate(concurrency / arrival_window) if arrival_window > 0 else 0.0
    return requests
