"""One MoE layer's device-resident expert cache: a fixed number of slots in front of the host copy of all of the
layer's experts, plus the byte and hit accounting every offload decision reports into.

Owns the slots and which expert is in which; knows nothing of routing or blocks (`offload` decides *which*
experts should be resident and when). Copies into slots and fetches of missed experts are host -> device copies
(non-blocking from pinned memory on a GPU); on a CPU-only machine both tiers are host memory and a copy is a
memcpy, but the accounting is the same.
Invariant: `slot_of` and `expert_in_slot` are inverse maps; a free slot holds no expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class OffloadCounters:
    """Cumulative, over all layers and steps. Assignments are routed (token, expert) pairs."""

    hits: int = 0
    """Assignments whose expert was resident in the cache."""
    misses: int = 0
    """Assignments whose expert was not (fetched for the step, or computed on the host)."""
    residency_loads: int = 0
    """Experts copied into cache slots (residency changes)."""
    fetches: int = 0
    """Missed experts copied to the device for one layer-step (prefetched or on demand)."""
    wasted_prefetches: int = 0
    """Prefetched experts the layer then did not route to."""
    host_computes: int = 0
    """Missed experts computed on the host over their tokens."""
    weight_bytes: int = 0
    """Expert weight bytes moved host -> device (residency loads + fetches)."""
    activation_bytes: int = 0
    """Hidden-state bytes moved for host computes (to the host and back)."""

    @property
    def bytes_moved(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ExpertCache:
    """`num_slots` device slots for one layer's experts. Host weights: gate_up [E, 2I, H], down [E, H, I] for
    global expert ids [expert_offset, expert_offset + E)."""

    def __init__(
        self,
        host_gate_up: torch.Tensor,
        host_down: torch.Tensor,
        num_slots: int,
        device: torch.device,
        counters: OffloadCounters,
        expert_offset: int = 0,
    ) -> None:
        self.host_gate_up, self.host_down = host_gate_up, host_down
        self.device, self.counters, self.expert_offset = device, counters, expert_offset
        self.num_slots = num_slots
        self.slot_gate_up = torch.empty((num_slots, *host_gate_up.shape[1:]), dtype=host_gate_up.dtype, device=device)
        self.slot_down = torch.empty((num_slots, *host_down.shape[1:]), dtype=host_down.dtype, device=device)
        self.slot_of: dict[int, int] = {}
        self.expert_in_slot: list[int | None] = [None] * num_slots
        self._copy_stream: torch.cuda.Stream | None = None

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's weights (gate, up and down projections)."""
        return (self.host_gate_up[0].numel() + self.host_down[0].numel()) * self.host_gate_up.element_size()

    @property
    def local_range(self) -> range:
        return range(self.expert_offset, self.expert_offset + self.host_gate_up.shape[0])

    def is_resident(self, expert: int) -> bool:
        return expert in self.slot_of

    def resident_weights(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.slot_of[expert]
        return self.slot_gate_up[slot], self.slot_down[slot]

    def host_weights(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        local = expert - self.expert_offset
        return self.host_gate_up[local], self.host_down[local]

    def set_residents(self, wanted: list[int]) -> None:
        """Makes the first `num_slots` experts of `wanted` (most wanted first) resident. Mutates the slots:
        residents not wanted are evicted (lowest id first) only as slots are needed, so a hot expert stays."""
        wanted = wanted[: self.num_slots]
        keep = set(wanted)
        evictable = sorted(e for e in self.slot_of if e not in keep)
        free = [s for s, e in enumerate(self.expert_in_slot) if e is None]
        for expert in wanted:
            if expert in self.slot_of:
                continue
            slot = free.pop() if free else self._evict(evictable.pop(0))
            self._load(expert, slot)

    def fetch(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of a non-resident expert's weights for one layer-step (counted as moved bytes)."""
        gate_up, down = self.host_weights(expert)
        self.counters.fetches += 1
        self.counters.weight_bytes += self.expert_bytes
        return gate_up.to(self.device, non_blocking=True), down.to(self.device, non_blocking=True)

    def prefetch(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
        """`fetch` issued ahead of use: on a GPU on a side stream, so the copy overlaps the current layer's compute;
        pass the returned event to `ready` before using the weights."""
        if self.device.type != "cuda":
            return (*self.fetch(expert), None)
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copy_stream):
            gate_up, down = self.fetch(expert)
            event = torch.cuda.Event()
            event.record()
        return gate_up, down, event

    def ready(self, event: torch.cuda.Event | None, *tensors: torch.Tensor) -> None:
        """Makes the current stream wait for a prefetch (no-op on CPU)."""
        if event is None:
            return
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for tensor in tensors:
            tensor.record_stream(stream)  # allocated on the copy stream, used (and freed) on this one

    def check_invariants(self) -> None:
        for expert, slot in self.slot_of.items():
            assert self.expert_in_slot[slot] == expert, f"slot {slot} does not hold expert {expert}"
        assert sum(e is not None for e in self.expert_in_slot) == len(self.slot_of), "slot maps disagree"

    def _evict(self, expert: int) -> int:
        slot = self.slot_of.pop(expert)
        self.expert_in_slot[slot] = None
        return slot

    def _load(self, expert: int, slot: int) -> None:
        gate_up, down = self.host_weights(expert)
        self.slot_gate_up[slot].copy_(gate_up, non_blocking=True)
        self.slot_down[slot].copy_(down, non_blocking=True)
        self.slot_of[expert], self.expert_in_slot[slot] = slot, expert
        self.counters.residency_loads += 1
        self.counters.weight_bytes += self.expert_bytes
