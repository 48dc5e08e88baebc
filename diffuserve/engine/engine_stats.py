"""The engine's cumulative counters (`EngineCounters`, added to by every step) and their point-in-time snapshot
(`EngineStats`: what /metrics and `bench` report). Knows nothing of how a step runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diffuserve.core.step import StepUpdate
from diffuserve.engine.spec_decode_stats import SpecDecodeStats
from diffuserve.engine.step_phases import StepPhases

if TYPE_CHECKING:
    from diffuserve.core.cache.manager import CacheManager
    from diffuserve.core.cache.recurrent import StateStats
    from diffuserve.core.scheduler import Scheduler
    from diffuserve.worker.experts import ExpertStatsSnapshot, OffloadStatsSnapshot


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
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    """Verified decoding's drafts and accepted tokens (all zero when no request verifies)."""
    phases: StepPhases = field(default_factory=StepPhases)
    """Wall seconds of every step's phases since start (engine/step_phases.py)."""

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
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    phases: StepPhases = field(default_factory=StepPhases)

    def record_step(self, num_tokens: int, seconds: float, update: StepUpdate) -> None:
        """A completed step: `num_tokens` query tokens, `seconds` in the forward and decoders, and the tokens its
        `update` computed (prompt) and made final (generated)."""
        self.num_steps += 1
        self.num_batched_tokens += num_tokens
        self.step_time_s += seconds
        self.num_prefill_tokens += update.num_prefill_tokens
        self.num_generated_tokens += update.num_generated_tokens
        if update.num_verified_blocks:
            self.spec_decode = self.spec_decode.add(update)

    def snapshot(
        self,
        scheduler: Scheduler,
        cache: CacheManager,
        experts: ExpertStatsSnapshot | None = None,
        offload: OffloadStatsSnapshot | None = None,
    ) -> EngineStats:
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_usage=cache.pool.usage,
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
            state=cache.state_stats(scheduler.prefix_hit_rate),
            spec_decode=dataclasses.replace(
                self.spec_decode,
                num_auto_drafting_steps=scheduler.drafts.num_drafting_steps,
                num_auto_autoregressive_steps=scheduler.drafts.num_autoregressive_steps,
            ),
            phases=dataclasses.replace(self.phases),  # a copy: the counters' own adds up in place
        )
