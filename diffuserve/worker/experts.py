"""The engine's side of a MoE model's experts: expert offload planning and expert-routing statistics.

Offload (`ExpertOffload`, per rank): sizes the per-layer expert caches from a byte budget, installs an offloading
runner in every MoE layer (see model/layers/moe/offload) and snapshots the accounting (hit rate, bytes moved) for
EngineStats, /metrics and `bench`. The routed experts' weights must already be in host memory (the loader puts
them there under offload); the rest of the model lives on the device. The step's blocks reach the runners through
the offload context the executor sets around each forward.

Statistics (`ExpertTracker`, rank 0): reads the routing each MoE layer leaves behind (`last_expert_ids`, [N, K]
for the step's N tokens) and keeps, per step and layer, how many distinct experts the whole batch touched and how
unevenly tokens spread over them (max / mean tokens per touched expert); per request and layer, the union of
experts its current block touched over all of the block's denoising steps. These are the numbers that decide MoE
cost in block diffusion (a block routes many tokens at once, and its expert set barely changes across steps) and
that calibrate the planner. Knows nothing of requests beyond their ids and block rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from diffuserve.model.layers.moe.expert_cache import ExpertCache, OffloadCounters
from diffuserve.model.layers.moe.layer import SparseMoeBlock
from diffuserve.model.layers.moe.offload import OffloadCostModel, OffloadedExperts


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


@dataclass(frozen=True)
class ExpertStatsSnapshot:
    num_experts: int
    experts_touched_per_step: float
    """Distinct experts per MoE layer per step (whole batch), averaged."""
    experts_touched_per_block: float
    """Distinct experts per MoE layer over one block's denoising steps (one request), averaged."""
    tokens_per_expert: float
    """Routed (token, expert) pairs per touched expert per layer-step, averaged."""
    load_imbalance: float
    """max / mean tokens over the touched experts of a layer-step, averaged (1.0 = perfectly even)."""
    experts_touched_by_blocks_per_step: float = 0.0
    """Distinct experts per MoE layer per step that the step's denoised blocks touch (their rows only: commits and
    prefill left out; what a block expert coreset caps), averaged over the layer-steps with blocks."""
    experts_per_block_forward: float = 0.0
    """Distinct experts per MoE layer of one block's rows in one forward, averaged over the blocks' layer-forwards
    (dMoE's `generate` reports this, its "unique experts", for its one sequence)."""


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


def moe_layers(model: nn.Module) -> list[SparseMoeBlock]:
    return [m for m in model.modules() if isinstance(m, SparseMoeBlock)]


class ExpertOffload:
    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        budget: int | None,
        policy: str,
        cost: OffloadCostModel | None = None,
    ) -> None:
        """Installs an offloading runner in every MoE layer of `model` (mutates the layers)."""
        blocks = moe_layers(model)
        if not blocks:
            raise ValueError(
                f"expert_offload: {type(model).__name__} has no MoE layers that offload can hold (the shared "
                "SparseMoeBlock's routed experts; docs/serving/moe.md lists its families); drop --expert-offload"
            )
        self.counters = OffloadCounters()
        cost = cost or OffloadCostModel.for_device(device)
        experts = blocks[0].experts
        per_expert = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
        expert_bytes = per_expert * experts.gate_up_proj.element_size()
        self.num_slots = num_cache_slots(budget, expert_bytes, len(blocks), experts.num_experts)
        self.num_experts = experts.num_experts
        self.runners: list[OffloadedExperts] = []
        for block in blocks:
            cache = ExpertCache(
                block.experts.gate_up_proj.data,
                block.experts.down_proj.data,
                self.num_slots,
                device,
                self.counters,
                block.experts.expert_offset,
            )
            runner = OffloadedExperts(cache, cost, policy, block.num_experts)
            if self.runners:
                self.runners[-1].next_layer = runner
            block.runner = runner
            self.runners.append(runner)

    def snapshot(self) -> OffloadStatsSnapshot:
        c = self.counters
        return OffloadStatsSnapshot(
            self.num_slots,
            self.num_experts,
            c.hit_rate,
            c.hits,
            c.misses,
            c.residency_loads,
            c.fetches,
            c.wasted_prefetches,
            c.host_computes,
            c.bytes_moved,
        )


class ExpertTracker:
    def __init__(self, model: nn.Module) -> None:
        self.layers = moe_layers(model)
        self.num_experts = max((m.num_experts for m in self.layers), default=0)
        self._blocks: dict[str, torch.Tensor] = {}  # request id -> [L, E] bool, the current block's union
        self._step_sums = torch.zeros(3, dtype=torch.float64)  # touched, tokens per expert, imbalance
        self._num_layer_steps = 0
        self._block_touched_sum = 0.0
        self._num_blocks = 0
        self._blocks_step_sum = 0.0  # distinct experts of the step's block rows, summed over layer-steps
        self._num_block_layer_steps = 0
        self._block_forward_sums = [0.0, 0]  # distinct experts of one block's rows, summed; layer-forwards

    @property
    def enabled(self) -> bool:
        return bool(self.layers)

    def record_step(self, block_rows: list[tuple[str, int, int]]) -> None:
        """After a forward. `block_rows`: (request id, first row, row count) of each request's block."""
        for layer_index, layer in enumerate(self.layers):
            ids = layer.last_expert_ids  # [N, K]
            assert ids is not None, "record_step() runs after a forward"
            counts = torch.bincount(ids.flatten(), minlength=self.num_experts).double()
            touched = counts[counts > 0]
            self._step_sums += torch.stack(
                (touched.new_tensor(len(touched)), touched.mean(), touched.max() / touched.mean())
            ).cpu()
            self._num_layer_steps += 1
            if block_rows:
                rows = torch.cat([ids[start : start + length].flatten() for _, start, length in block_rows])
                self._blocks_step_sum += float(rows.unique().numel())
                self._num_block_layer_steps += 1
            for request_id, start, length in block_rows:
                self._block_forward_sums[0] += float(ids[start : start + length].unique().numel())
                self._block_forward_sums[1] += 1
                union = self._blocks.setdefault(
                    request_id, torch.zeros(len(self.layers), self.num_experts, dtype=torch.bool, device=ids.device)
                )
                union[layer_index, ids[start : start + length].flatten()] = True

    def finish_block(self, request_id: str) -> None:
        """The request's block is final (or the request finished): record its expert union, start a new one."""
        union = self._blocks.pop(request_id, None)
        if union is not None:
            self._block_touched_sum += float(union.sum(dim=1).double().mean())
            self._num_blocks += 1

    def snapshot(self) -> ExpertStatsSnapshot:
        steps = max(self._num_layer_steps, 1)
        touched, per_expert, imbalance = (self._step_sums / steps).tolist()
        per_block = self._block_touched_sum / self._num_blocks if self._num_blocks else 0.0
        by_blocks = self._blocks_step_sum / max(self._num_block_layer_steps, 1)
        per_forward = self._block_forward_sums[0] / max(self._block_forward_sums[1], 1)
        return ExpertStatsSnapshot(self.num_experts, touched, per_block, per_expert, imbalance, by_blocks, per_forward)
