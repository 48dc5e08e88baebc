"""Expert offload for one MoE layer: which experts are resident in its device cache, and where each missed
expert is computed. An `ExpertRunner` (see layer), so the MoE layer's dispatch is unchanged: every expert still
runs once over its sorted run of tokens with the same matmuls, only its weights come from a cache slot, a fetched
copy or the host; on one device the rows are bit-identical to the plain dispatch.

Residency (`policy`):
    block  the block's first step's routing, per layer, decides the resident set (the experts most wanted by the
           live blocks' first steps); the set is kept for the blocks' later steps, whose experts barely change
           (TIDE), so a transfer is paid once per block instead of once per step
    step   the resident set is re-chosen from every step's routing (what an autoregressive offloader does)
A miss is fetched to the device for that layer-step or computed on the host, whichever `OffloadCostModel` says is
cheaper; experts this layer fetched at the previous step are prefetched while the layer before it runs.
Knows nothing of requests: it reads the step's block rows from the current `offload_context`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.model.layers.moe.dispatch import ExpertGroups, run_expert
from diffuserve.model.layers.moe.expert_cache import ExpertCache
from diffuserve.model.layers.moe.offload_context import current_offload_context

RESIDENCY_POLICIES = ("block", "step")


@dataclass(frozen=True)
class OffloadCostModel:
    """Fetch a missed expert iff copying its weights is no slower than computing its tokens on the host:
    expert_bytes / link <= tokens * (flops_per_token / host_flops + 2 * activation_bytes / link)."""

    link_bytes_per_s: float
    """Host -> device copy bandwidth."""
    host_flops_per_s: float
    """Host matmul rate for the expert's dtype."""

    @classmethod
    def for_device(cls, device: torch.device) -> OffloadCostModel:
        """Defaults: PCIe-class link and a many-core host for GPUs; memcpy and one core on CPU-only machines."""
        if device.type == "cuda":
            return cls(link_bytes_per_s=25e9, host_flops_per_s=3e11)
        return cls(link_bytes_per_s=1e10, host_flops_per_s=5e10)

    def prefers_fetch(self, expert_bytes: int, num_tokens: int, flops_per_token: int, activation_bytes: int) -> bool:
        fetch_s = expert_bytes / self.link_bytes_per_s
        host_s = num_tokens * (flops_per_token / self.host_flops_per_s + 2 * activation_bytes / self.link_bytes_per_s)
        return fetch_s <= host_s


def most_wanted(counts: torch.Tensor, experts: range) -> list[int]:
    """Experts of `experts` with counts [E_total] > 0, most tokens first (ties: lower id first)."""
    local = counts[experts.start : experts.stop].tolist()
    ranked = sorted((-c, experts.start + i) for i, c in enumerate(local) if c > 0)
    return [expert for _, expert in ranked]


class OffloadedExperts:
    """The ExpertRunner of one offloaded MoE layer. `next_layer` (set by the owner) is prefetched into."""

    def __init__(self, cache: ExpertCache, cost: OffloadCostModel, policy: str, num_experts: int) -> None:
        if policy not in RESIDENCY_POLICIES:
            raise ValueError(f"expert_residency: {policy!r} is not one of {', '.join(RESIDENCY_POLICIES)}")
        self.cache, self.cost, self.policy = cache, cost, policy
        self.num_experts = num_experts
        self.counters = cache.counters
        self.next_layer: OffloadedExperts | None = None
        self._block_demand: dict[tuple[str, int], torch.Tensor] = {}  # block key -> [E] its first step's counts
        self._predicted: list[int] = []  # experts fetched at the previous step: next step's prefetch
        self._staged: dict[int, tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]] = {}
        gate_up = cache.host_gate_up
        self._flops_per_token = 2 * (gate_up[0].numel() + cache.host_down[0].numel())
        self._activation_bytes = gate_up.shape[-1] * gate_up.element_size()

    def run(self, sorted_x: torch.Tensor, groups: ExpertGroups, ids: torch.Tensor, sorted_out: torch.Tensor) -> None:
        """Updates residency, prefetches for the next layer, then computes this rank's runs into sorted_out."""
        self._update_residency(groups, ids)
        if self.next_layer is not None:
            self.next_layer.prefetch()
        fetched: list[int] = []
        for expert, rows in groups.runs(self.cache.local_range):
            sorted_out[rows] = self._compute(expert, sorted_x[rows], fetched)
        self.counters.wasted_prefetches += len(self._staged)
        self._staged.clear()
        self._predicted = fetched

    def prefetch(self) -> None:
        """Copies ahead the experts this layer fetched at the previous step and still misses (TIDE: the same
        blocks route to nearly the same experts at their next step)."""
        for expert in self._predicted:
            if not self.cache.is_resident(expert) and expert not in self._staged:
                self._staged[expert] = self.cache.prefetch(expert)

    def _compute(self, expert: int, x: torch.Tensor, fetched: list[int]) -> torch.Tensor:
        """x [M, H]: the expert's tokens -> [M, H], from wherever its weights are."""
        if self.cache.is_resident(expert):
            self.counters.hits += x.shape[0]
            return run_expert(x, *self.cache.resident_weights(expert))
        self.counters.misses += x.shape[0]
        if expert in self._staged:
            fetched.append(expert)
            gate_up, down, event = self._staged.pop(expert)
            self.cache.ready(event, gate_up, down)
            return run_expert(x, gate_up, down)
        if self.cost.prefers_fetch(self.cache.expert_bytes, x.shape[0], self._flops_per_token, self._activation_bytes):
            fetched.append(expert)
            return run_expert(x, *self.cache.fetch(expert))
        self.counters.host_computes += 1
        self.counters.activation_bytes += 2 * x.shape[0] * self._activation_bytes
        gate_up, down = self.cache.host_weights(expert)
        return run_expert(x.to(gate_up.device), gate_up, down).to(x.device)

    def _update_residency(self, groups: ExpertGroups, ids: torch.Tensor) -> None:
        experts = self.cache.local_range
        if self.policy == "step":
            self.cache.set_residents(most_wanted(torch.tensor(groups.counts), experts))
            return
        blocks = current_offload_context().blocks
        new = [b for b in blocks if b.is_first_step]
        if not new:
            return  # per-block residency: nothing changes between block starts
        live = {b.key for b in blocks}
        self._block_demand = {k: v for k, v in self._block_demand.items() if k in live}
        for block in new:
            routed = ids[block.start : block.start + block.length].flatten()
            self._block_demand[block.key] = torch.bincount(routed, minlength=self.num_experts).cpu()
        self.cache.set_residents(most_wanted(torch.stack(list(self._block_demand.values())).sum(dim=0), experts))
