"""One step's token budgets: all the step's query tokens (`max_num_batched_tokens`), and the prefill commits among
them (`max_prefill_tokens`, while a running request is decoding; core/scheduler.py applies it). Torch-free.

Prefill is a prompt's blocks, or a preempted request's recompute: every commit but the one finished block a decode
step commits. A step that prefills arriving prompts beside decoding requests delays their next tokens by its own
length, so prefill gets a share of the step of its own. Knows nothing of queues or caches.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest

CPU_PREFILL_TOKENS = 256
"""`max_prefill_tokens`' default on a CPU, measured (docs/benchmarks/throughput.md, "Prefill budget"): on Clover's
bench shape at 128 concurrent, realistic workload, ITL p99 / p50 2.6x to 2.9x over three runs (1.3x to 5.4x
without a budget) with a lower TTFT p50 (1.4 s against 1.9 s); 128 steadies the ITL no further, 512 lets it
grow back to 4x to 5x."""


def default_prefill_tokens(device_type: str, max_num_batched_tokens: int, block_length: int) -> int:
    """`max_prefill_tokens`' default on `device_type` (a torch device type): on a CPU a step's time grows with
    every token from the first, so prefill gets a share of the step; on a GPU, where a step's time barely grows
    until a few thousand tokens, the whole step budget (as vLLM's chunked prefill; an estimate, not measured)."""
    if device_type == "cuda":
        return max_num_batched_tokens
    return max(CPU_PREFILL_TOKENS, block_length)


def is_prefill(request: Request, commit_target: int | None = None) -> bool:
    """Whether the request has prefill commits pending (its prompt, or a recompute after preemption): commits
    other than the one finished block a decode step commits. A request without is decoding. `commit_target`: the
    request's, where the caller has read it already (a property worth computing once per request-step)."""
    target = request.commit_target if commit_target is None else commit_target
    pending = target - request.num_computed_tokens
    if pending > request.block_length:
        return True
    return pending > 0 and request.block_start <= request.num_prefill_positions


@dataclass
class StepBudget:
    """What is left of one step's token budgets: all query tokens, and the prefill commits among them."""

    tokens: int
    prefill_tokens: int

    def spend(self, work: ScheduledRequest, is_prefill: bool) -> None:
        self.tokens -= work.num_tokens
        if is_prefill:
            self.prefill_tokens -= work.commit_end - work.commit_start
