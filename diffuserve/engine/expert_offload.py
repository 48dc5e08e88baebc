"""Expert offload across a model: sizes the per-layer expert caches from a byte budget, installs an offloading
runner in every MoE layer (see model/layers/moe_offload), tells them each step's blocks, and snapshots the
accounting (hit rate, bytes moved) for EngineStats, /metrics and `bench`.

The routed experts' weights must already be in host memory (the loader puts them there under offload); the rest
of the model lives on the device. Knows nothing of requests beyond the block rows the runner passes in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from diffuserve.model.layers.expert_cache import ExpertCache, OffloadCounters
from diffuserve.model.layers.moe import SparseMoeBlock
from diffuserve.model.layers.moe_offload import BlockRef, OffloadCostModel, OffloadedExperts, StepPlan


@dataclass(frozen=True)
class OffloadStatsSnapshot:
    num_slots_per_layer: int
    num_experts_per_layer: int
    """Experts this rank holds per MoE layer (all of them unless expert parallel)."""
    hit_rate: float
    """Routed (token, expert) assignments served by a resident expert / all assignments."""
    hits: int
    misses: int
    residency_loads: int
    fetches: int
    wasted_prefetches: int
    host_computes: int
    bytes_moved: int
    """Expert weights copied host -> device plus hidden states moved for host computes, since start."""


def num_cache_slots(budget: int | None, expert_bytes: int, num_layers: int, num_experts: int) -> int:
    """Slots per MoE layer: the budget split evenly over the layers (default: a quarter of the experts)."""
    if budget is None:
        return max(1, num_experts // 4)
    slots = budget // (expert_bytes * num_layers)
    if slots < 1:
        raise ValueError(
            f"expert_cache_memory: {budget} bytes hold no expert per MoE layer ({num_layers} layers x "
            f"{expert_bytes} bytes per expert); raise it to at least {expert_bytes * num_layers}"
        )
    return min(slots, num_experts)


class ExpertOffload:
    def __init__(self, model: nn.Module, device: torch.device, budget: int | None, policy: str,
                 cost: OffloadCostModel | None = None) -> None:
        blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        if not blocks:
            raise ValueError("expert_offload: the model has no MoE layers; drop --expert-offload")
        self.plan = StepPlan()
        self.counters = OffloadCounters()
        cost = cost or OffloadCostModel.for_device(device)
        experts = blocks[0].experts
        per_expert = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
        expert_bytes = per_expert * experts.gate_up_proj.element_size()
        self.num_slots = num_cache_slots(budget, expert_bytes, len(blocks), experts.num_experts)
        self.num_experts = experts.num_experts
        self.runners: list[OffloadedExperts] = []
        for block in blocks:
            cache = ExpertCache(block.experts.gate_up_proj.data, block.experts.down_proj.data, self.num_slots, device,
                                self.counters, block.experts.expert_offset)
            runner = OffloadedExperts(cache, self.plan, cost, policy, block.num_experts)
            if self.runners:
                self.runners[-1].next_layer = runner
            block.runner = runner
            self.runners.append(runner)

    def begin_step(self, blocks: tuple[BlockRef, ...]) -> None:
        """Before a forward: the step's blocks (their rows, and which are at their first step)."""
        self.plan.blocks = blocks

    def snapshot(self) -> OffloadStatsSnapshot:
        c = self.counters
        return OffloadStatsSnapshot(
            self.num_slots, self.num_experts, c.hit_rate, c.hits, c.misses, c.residency_loads, c.fetches,
            c.wasted_prefetches, c.host_computes, c.bytes_moved,
        )
