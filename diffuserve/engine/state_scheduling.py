"""The scheduler's side of recurrent state (hybrid models): which request holds which state slot, which prefix
a new request can restore, and when a running request's state is snapshotted. Torch-free.

Prompt scoring (`prompt_logprobs`) previews the state after the blocks before each scored block, and a slot
holds one state: a scoring request commits only up to the block of its next scored position, and a prefix hit
may not reach past it (engine/prompt_scoring.py).

Lifecycle of a slot: taken at admission (a prefix-cache hit first copies the prefix's snapshot into it, else it
starts empty), advanced by every forward that commits the request's tokens, freed when the request finishes, is
aborted or is preempted (its state is dropped with its pages and recomputed on resume: the commit forwards that
rebuild the pages rebuild the state in the same pass, so saving it would only save the GDN part of forwards the
pages need anyway).

Prefix cache: a cached prefix is a page chain *and* a snapshot of the state after it. Snapshots are taken at
page boundaries every `interval_pages` pages and at the last page boundary of each prompt's complete blocks,
into spare slots only, and evicted LRU when a sequence needs the slot. A new request restores the longest prefix
that has both its pages and a snapshot; its matched pages beyond that are released.
"""

from __future__ import annotations

import dataclasses

from diffuserve.engine.kv_pages import chain_hash
from diffuserve.engine.request import Request, ScheduledRequest, StateSnapshot
from diffuserve.engine.state_slots import StatePool


class StateSlots:
    def __init__(self, pool: StatePool, page_size: int, interval_pages: int) -> None:
        self.pool, self.page_size, self.interval_pages = pool, page_size, interval_pages
        self._pending: list[StateSnapshot] = []  # reserved this step, registered when the step is applied
        self._pinned: set[int | None] = set()  # snapshots a request of this step restores: not evicted before the copy
        self.num_state_hit_tokens = 0

    def start_step(self) -> None:
        """Snapshots reserved by a step that failed (never applied) go back to the free list."""
        for snapshot in self._pending:
            self.pool.free(snapshot.slot)
        self._pending = []
        self._pinned = set()

    # ---- admission -----------------------------------------------------------------------------------------
    def usable_prefix(self, page_hashes: list[int]) -> tuple[int, int | None]:
        """Of the cached pages matching `page_hashes` (in order), how many have a state snapshot after them:
        (number of pages, snapshot slot or None)."""
        for count in range(len(page_hashes), 0, -1):
            slot = self.pool.lookup(page_hashes[count - 1])
            if slot is not None:
                return count, slot
        return 0, None

    def max_prefix_pages(self, request: Request) -> int:
        """Whole pages before the block a hit may cover. When the block's first position is generated (and so
        predicted from the position before it, under the AR shift) one position is left to recompute, whose
        forward yields that prediction's hidden row."""
        end = request.block_start - (1 if request.generation_start_in_block() == 0 else 0)
        if request.num_unscored:
            # No state past the next scored block (`scoring_commit_limit`); if the next scored position is a
            # block's first, none past the row that predicts it either.
            first = request.score_cursor % request.block_length == 0
            end = min(end, self._scored_block_start(request) - (1 if first else 0))
        return max(end, 0) // self.page_size

    def scoring_commit_limit(self, request: Request) -> int:
        """Positions the request may commit this step. While it scores its prompt (prompt_logprobs) the commits
        stop at the block of its next scored position: that block's variants preview the state after exactly
        the blocks before it, and the slot holds only the state after the step's commits (its first position is
        read from the last committed row, kept as the slot's `last_hidden`)."""
        if not request.num_unscored:
            return request.commit_target
        return max(0, self._scored_block_start(request) - request.num_computed_tokens)

    @staticmethod
    def _scored_block_start(request: Request) -> int:
        return request.score_cursor // request.block_length * request.block_length

    def can_admit(self, restore_from: int | None) -> bool:
        return self.pool.can_allocate(keep=self._pinned | {restore_from})

    def admit(self, request: Request, restore_from: int | None) -> None:
        request.state_slot = self.pool.allocate(keep=self._pinned | {restore_from})
        if restore_from is not None:
            self._pinned.add(restore_from)
            self.num_state_hit_tokens += request.num_computed_tokens

    def release(self, request: Request) -> None:
        if request.state_slot is not None:
            self.pool.free(request.state_slot)
            request.state_slot = None

    # ---- snapshots -----------------------------------------------------------------------------------------
    def with_snapshot(self, work: ScheduledRequest) -> ScheduledRequest:
        """`work` with a snapshot of the state at the last snapshot boundary its commit range reaches, if a
        spare slot allows."""
        position = self._boundary(work)
        if position is None:
            return work
        prefix_hash = self._prefix_hash(work.request, position // self.page_size)
        slot = self.pool.reserve_snapshot(prefix_hash)
        if slot is None:
            return work
        snapshot = StateSnapshot(position, slot, prefix_hash)
        self._pending.append(snapshot)
        return dataclasses.replace(work, snapshot=snapshot)

    def apply(self, work: ScheduledRequest) -> None:
        """After the step: the snapshot it took is registered."""
        if work.snapshot is not None and work.snapshot in self._pending:
            self._pending.remove(work.snapshot)
            self.pool.register_snapshot(work.snapshot.slot, work.snapshot.prefix_hash)

    def _boundary(self, work: ScheduledRequest) -> int | None:
        if not self.pool.enable_snapshots:
            return None
        page, request = self.page_size, work.request
        prompt_end = request.num_prefill_positions // page * page
        interval = self.interval_pages * page
        candidates = [work.commit_end // interval * interval]
        if work.commit_start < prompt_end <= work.commit_end:
            candidates.append(prompt_end)
        best = max(candidates)
        return best if work.commit_start < best <= work.commit_end and best > 0 else None

    def _prefix_hash(self, request: Request, num_pages: int) -> int:
        """Chain hash of the request's first `num_pages` pages (those already committed are hashed already)."""
        page = self.page_size
        hashes = request.page_hashes[:num_pages]
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_pages):
            parent = chain_hash(parent, request.known_tokens(i * page, (i + 1) * page))
        assert parent is not None, "a snapshot boundary is after at least one page"
        return parent
