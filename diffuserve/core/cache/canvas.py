"""The CanvasState cache kind (renoise canvases, DiffusionGemma): which running request holds which canvas slot,
the row of the self-conditioning pool that its canvas's next step reads (worker/cache/canvas_step.py). Torch-free.

A slot is taken with a request's first work after admission and given back when the request finishes, is
aborted or is preempted. What it holds (the previous step's soft embeddings) is not recomputable from tokens, so
a request that comes back after a preemption restarts its current canvas from the canvas's first step; the
renoise decoder then redraws it from the generator state it saved at that canvas's start, so the redone canvas
is the one the request would have decoded anyway (decoding/renoise.py). The pool holds max_num_seqs
slots, one per running request: a slot is never waited for. Prefixes are the paged kinds' business.
"""

from __future__ import annotations

from diffuserve.core.cache.kind import CacheKind
from diffuserve.core.cache.recurrent import SlotPool
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest


class CanvasKind(CacheKind):
    name = "canvas"

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.pool = SlotPool(num_slots, slot_bytes, enable_snapshots=False)

    def start_step(self) -> None:
        """Nothing to return: slots are taken by allocate and given back by release only."""

    def check_fits(self, request: Request) -> tuple[bool, str]:
        slots = self.pool.num_slots
        return slots >= 1, f"one canvas slot of {self.pool.slot_bytes / 2**20:.2f} MiB (the pool holds {slots})"

    def prefix_limit(self, request: Request) -> int:
        return request.block_start

    def match_prefix(self, request: Request, page_hashes: list[int]) -> int:
        """Any prefix: a canvas slot holds nothing of it."""
        return len(page_hashes)

    def trim_prefix(self, request: Request, num_pages: int) -> None:
        """Nothing was taken for the prefix."""

    def can_allocate(self, work: ScheduledRequest) -> bool:
        return work.request.canvas_slot is not None or self.pool.can_allocate()

    def allocate(self, work: ScheduledRequest) -> ScheduledRequest:
        """A request without a slot takes one; if it had stepped its canvas before (it was preempted), the canvas
        restarts, since its self-conditioning input went with the slot it held."""
        request = work.request
        if request.canvas_slot is None:
            request.canvas_slot = self.pool.allocate()
            if request.step_in_block:
                request.open_block(request.block_start)
        return work

    def apply(self, work: ScheduledRequest, page_hashes: list[int], num_registered: int) -> None:
        """Nothing to register: the runner wrote the step's soft embeddings into the slot."""

    def rollback(self, request: Request, num_pages: int) -> None:
        """Nothing: renoise canvases are never verified."""

    def release(self, request: Request) -> None:
        if request.canvas_slot is not None:
            self.pool.free(request.canvas_slot)
            request.canvas_slot = None

    def check_invariants(self) -> None:
        self.pool.check_invariants()
