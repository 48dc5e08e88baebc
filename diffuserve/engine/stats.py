"""Cumulative engine counters and point-in-time snapshots (what /metrics and `bench` report). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffuserve.engine.experts import ExpertStatsSnapshot, OffloadStatsSnapshot
    from diffuserve.engine.kv_pages import PagePool
    from diffuserve.engine.scheduler import Scheduler
    from diffuserve.engine.scheduler_output import StepUpdate
    from diffuserve.engine.state_slots import StatePool


@dataclass(frozen=True)
class StateStats:
    slots_used: int
    """Slots held by running sequences."""
    slots_total: int
    num_snapshots: int
    """Slots holding a prefix snapshot (evictable)."""
    slot_bytes: int
    hit_rate: float
    """Share of the looked-up prompt tokens restored from a state snapshot (with their pages): what a hybrid
    model actually reuses."""


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
    page_hit_rate: float = 0.0
    """Share of the looked-up prompt tokens whose KV pages the prefix cache held (for models without
    recurrent state, the same as prefix_hit_rate)."""
    state: StateStats | None = None
    """Hybrid models (GDN layers): the recurrent-state pool."""

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
        self,
        scheduler: Scheduler,
        pool: PagePool,
        experts: ExpertStatsSnapshot | None = None,
        offload: OffloadStatsSnapshot | None = None,
        state_pool: StatePool | None = None,
    ) -> EngineStats:
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_usage=pool.usage,
            prefix_hit_rate=scheduler.prefix_hit_rate,
            num_preemptions=scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_batched_tokens=self.num_batched_tokens,
            num_generated_tokens=self.num_generated_tokens,
            num_prefill_tokens=self.num_prefill_tokens,
            step_time_s=self.step_time_s,
            num_prefix_hit_tokens=scheduler.num_prefix_hit_tokens,
            num_prefix_queried_tokens=scheduler.num_prefix_queried_tokens,
            experts=experts,
            offload=offload,
            page_hit_rate=scheduler.page_hit_rate,
            state=None
            if state_pool is None
            else StateStats(
                state_pool.num_used_slots,
                state_pool.num_slots,
                state_pool.num_snapshots,
                state_pool.slot_bytes,
                scheduler.prefix_hit_rate,
            ),
        )
