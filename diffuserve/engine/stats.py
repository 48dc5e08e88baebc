"""Cumulative engine counters and point-in-time snapshots (what /metrics and `bench` report). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffuserve.engine.experts import ExpertStatsSnapshot, OffloadStatsSnapshot
    from diffuserve.engine.kv_pages import PagePool
    from diffuserve.engine.scheduler import Scheduler
    from diffuserve.engine.scheduler_output import StepUpdate


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    """Fraction of KV pages referenced by requests."""
    prefix_hit_rate: float
    num_preemptions: int
    num_steps: int
    """Forwards the engine ran (each step is one forward over the whole batch)."""
    num_batched_tokens: int
    """Query tokens over all steps (blocks, commits, prefill chunks)."""
    num_generated_tokens: int
    num_prefill_tokens: int
    """Prompt tokens whose K/V the engine computed (prefix-cache hits are not computed)."""
    step_time_s: float
    """Wall time spent inside model forwards and decoders."""
    num_prefix_hit_tokens: int
    num_prefix_queried_tokens: int
    experts: ExpertStatsSnapshot | None = None
    """Routing statistics (MoE models only)."""
    offload: OffloadStatsSnapshot | None = None
    """Expert-cache statistics (with --expert-offload only; rank 0's experts under expert parallelism)."""

    @property
    def tokens_per_step(self) -> float:
        return self.num_batched_tokens / self.num_steps if self.num_steps else 0.0

    @property
    def expert_bytes_per_generated_token(self) -> float:
        """Bytes the expert offload moved (weights and activations) per generated token, since start."""
        if self.offload is None or not self.num_generated_tokens:
            return 0.0
        return self.offload.bytes_moved / self.num_generated_tokens


@dataclass
class EngineCounters:
    num_steps: int = 0
    num_batched_tokens: int = 0
    num_generated_tokens: int = 0
    num_prefill_tokens: int = 0
    step_time_s: float = 0.0

    def record_step(self, num_tokens: int, seconds: float, update: StepUpdate) -> None:
        """A completed step: `num_tokens` query tokens, `seconds` in the forward and decoders, and the tokens its
        `update` computed (prompt) and made final (generated)."""
        self.num_steps += 1
        self.num_batched_tokens += num_tokens
        self.step_time_s += seconds
        self.num_prefill_tokens += update.num_prefill_tokens
        self.num_generated_tokens += update.num_generated_tokens

    def snapshot(
        self, scheduler: Scheduler, pool: PagePool, experts: ExpertStatsSnapshot | None = None,
        offload: OffloadStatsSnapshot | None = None,
    ) -> EngineStats:
        return EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting), kv_usage=pool.usage,
            prefix_hit_rate=scheduler.prefix_hit_rate, num_preemptions=scheduler.num_preemptions,
            num_steps=self.num_steps, num_batched_tokens=self.num_batched_tokens,
            num_generated_tokens=self.num_generated_tokens, num_prefill_tokens=self.num_prefill_tokens,
            step_time_s=self.step_time_s,
            num_prefix_hit_tokens=scheduler.num_prefix_hit_tokens,
            num_prefix_queried_tokens=scheduler.num_prefix_queried_tokens, experts=experts, offload=offload,
        )
