"""The RecurrentState cache kind (GDN layers): which request holds which state slot, which prefix a new request
can restore, and when a running request's state is snapshotted. Torch-free.

Prompt scoring (`prompt_logprobs`) previews the state after the blocks before each scored block, and a slot
holds one state: a scoring request commits only up to the block of its next scored position, and a prefix hit
may not reach past it (worker/prompt_scoring.py).

Lifecycle of a slot: taken at admission (a prefix-cache hit first copies the prefix's snapshot into it, else it
starts empty), advanced by every forward that commits the request's tokens, freed when the request finishes, is
aborted or is preempted (its state is dropped with its pages and recomputed on resume: the commit forwards that
rebuild the pages rebuild the state in the same pass, so saving it would only save the GDN part of forwards the
pages need anyway).

Prefix cache: a cached prefix is a page chain *and* a snapshot of the state after it. Snapshots are taken at
page boundaries every `interval_pages` pages and at the last page boundary of each prompt's complete blocks,
into spare slots only, and evicted LRU when a sequence needs the slot. A new request restores the longest prefix
that has both its pages and a snapshot; its matched pages beyond that are released.

The slot pool (`SlotPool`) holds slot ids and the snapshot index. Running sequences are kept in one range of
slots, which the GDN layers read and advance in place instead of gathering copies (model/families/clover_moe/
gdn_step): a sequence takes the lowest free slot and a snapshot the highest, and when sequences finish out of
order, a running sequence above the range moves down into the lowest free slot (`SlotPool.move_down`; its state
is copied by the step's forward before anything reads it: `ScheduledRequest.move_from`).
Invariant: every slot is in exactly one of {free, snapshot (evictable), used}; used slots have a reference,
snapshot slots are registered under one hash, and the hash index maps only to snapshot slots.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass

from diffuserve.core.cache.kind import CacheKind
from diffuserve.core.cache.paged import chain_hash
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest, StateSnapshot


class OutOfStateSlots(RuntimeError):
    """`allocate` found no free or evictable slot."""


@dataclass(frozen=True)
class StateStats:
    """The slot pool as /metrics and `bench` report it."""

    slots_used: int
    """Slots held by running sequences."""
    slots_total: int
    num_snapshots: int
    """Slots holding a prefix snapshot (evictable)."""
    slot_bytes: int
    hit_rate: float
    """Share of the looked-up prompt tokens restored from a state snapshot (with their pages): what a hybrid
    model actually reuses."""


class SlotPool:
    def __init__(self, num_slots: int, slot_bytes: int, enable_snapshots: bool = True) -> None:
        self.num_slots, self.slot_bytes = num_slots, slot_bytes
        self.enable_snapshots = enable_snapshots
        self._free: list[int] = list(range(num_slots))  # ascending
        self._snapshots: OrderedDict[int, int] = OrderedDict()  # slot -> hash, LRU order: oldest first
        self._slot_of: dict[int, int] = {}  # hash -> snapshot slot
        self._used: set[int] = set()
        self._sequences: set[int] = set()  # the used slots that hold a sequence (the rest: snapshots being written)
        self.num_snapshots_taken = 0
        self.num_snapshots_evicted = 0

    # ---- queries -------------------------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        """Slots `allocate` can hand out (free + snapshots)."""
        return len(self._free) + len(self._snapshots)

    @property
    def num_used_slots(self) -> int:
        """Slots held by running sequences (and snapshots being written this step)."""
        return len(self._used)

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    def can_allocate(self, keep: Set[int | None] = frozenset()) -> bool:
        """Whether `allocate(keep)` would find a slot."""
        return bool(self._free) or any(s not in keep for s in self._snapshots)

    def lookup(self, prefix_hash: int) -> int | None:
        """The snapshot slot of a prefix, or None; a hit refreshes its LRU position."""
        slot = self._slot_of.get(prefix_hash)
        if slot is not None:
            self._snapshots.move_to_end(slot)
        return slot

    # ---- mutations -----------------------------------------------------------------------------------------
    def allocate(self, keep: Set[int | None] = frozenset()) -> int:
        """A slot for a sequence, evicting the least recently used snapshot if none is free (never one in
        `keep`: snapshots about to be restored this step)."""
        if self._free:
            slot = self._free.pop(0)
        else:
            victims = [s for s in self._snapshots if s not in keep]
            if not victims:
                raise OutOfStateSlots(f"no free recurrent-state slot ({self.num_slots} in the pool)")
            slot = victims[0]
            self._evict(slot)
        self._used.add(slot)
        self._sequences.add(slot)
        return slot

    def free(self, slot: int) -> None:
        assert slot in self._used, f"state slot {slot} freed twice or never allocated"
        self._used.remove(slot)
        self._sequences.discard(slot)
        bisect.insort(self._free, slot)

    def move_down(self, slot: int) -> int | None:
        """The lowest free slot, now the sequence's instead of `slot` (freed), when `slot` lies outside the range
        [0, sequences held) and a lower slot is free; else None. Only the sequences above the range move (not
        every sequence above a hole), and never into a snapshot's slot."""
        assert slot in self._sequences, f"state slot {slot} holds no sequence"
        if slot < len(self._sequences) or not self._free or self._free[0] > slot:
            return None
        new = self._free.pop(0)
        self._used.add(new)
        self._sequences.add(new)
        self.free(slot)
        return new

    def reserve_snapshot(self, prefix_hash: int) -> int | None:
        """A slot to copy a prefix's state into this step, from the free list only (a snapshot never evicts
        another or takes a running sequence's room). None if snapshots are off, the prefix already has one or no
        slot is free. The slot is used until `register_snapshot`."""
        if not self.enable_snapshots or prefix_hash in self._slot_of or not self._free:
            return None
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def register_snapshot(self, slot: int, prefix_hash: int) -> None:
        """The state of the prefix `prefix_hash` is in `slot` (written by the step that reserved it)."""
        self._used.remove(slot)
        if prefix_hash in self._slot_of:  # another sequence registered the same prefix in the same step
            bisect.insort(self._free, slot)
            return
        self._snapshots[slot] = prefix_hash
        self._slot_of[prefix_hash] = slot
        self.num_snapshots_taken += 1

    def stats(self, hit_rate: float) -> StateStats:
        """A point-in-time view; `hit_rate`: the scheduler's share of prompt tokens restored."""
        return StateStats(self.num_used_slots, self.num_slots, self.num_snapshots, self.slot_bytes, hit_rate)

    def check_invariants(self) -> None:
        free, snaps = set(self._free), set(self._snapshots)
        assert len(free) == len(self._free), "duplicate slot in the free list"
        assert self._free == sorted(self._free), "the free list is out of order"
        assert self._sequences <= self._used, "a sequence's slot is not used"
        assert not free & snaps and not free & self._used and not snaps & self._used, "a slot is in two sets"
        assert len(free) + len(snaps) + len(self._used) == self.num_slots, "a slot is lost"
        assert all(self._snapshots[s] == h for h, s in self._slot_of.items()), "hash index out of sync"

    def _evict(self, slot: int) -> None:
        del self._slot_of[self._snapshots.pop(slot)]
        self.num_snapshots_evicted += 1


class RecurrentKind(CacheKind):
    name = "state"

    def __init__(self, pool: SlotPool, page_size: int, interval_pages: int) -> None:
        self.pool, self.page_size, self.interval_pages = pool, page_size, interval_pages
        self._pending: list[StateSnapshot] = []  # reserved this step, registered when the step is applied
        self._pinned: set[int | None] = set()  # snapshots a request of this step restores: not evicted before the copy
        self._restore: dict[str, int] = {}  # request id -> the snapshot its prefix hit restores

    def start_step(self) -> None:
        for snapshot in self._pending:
            self.pool.free(snapshot.slot)
        self._pending = []
        self._pinned = set()

    def check_fits(self, request: Request) -> tuple[bool, str]:
        slots = self.pool.num_slots
        return slots >= 1, (
            f"one recurrent-state slot of {self.pool.slot_bytes / 2**20:.2f} MiB (the state cache holds {slots}; "
            "--state-cache-memory)"
        )

    # ---- prefix --------------------------------------------------------------------------------------------
    def prefix_limit(self, request: Request) -> int:
        """Positions before the block a hit may cover. When the block's first position is generated (and so
        predicted from the position before it, under the AR shift) one position is left to recompute, whose
        forward yields that prediction's hidden row."""
        generated_first = request.draft.tokens or request.generation_start_in_block() == 0  # a draft: conservatively
        end = request.settled_end - (1 if generated_first else 0)
        if request.num_unscored:
            # No state past the next scored block (`commit_limit`); if the next scored position is a block's
            # first, none past the row that predicts it either.
            first = request.score_cursor % request.block_length == 0
            end = min(end, _scored_block_start(request) - (1 if first else 0))
        return max(end, 0)

    def match_prefix(self, request: Request, page_hashes: list[int]) -> int:
        """The longest run of the matched pages with a state snapshot after it."""
        for count in range(len(page_hashes), 0, -1):
            slot = self.pool.lookup(page_hashes[count - 1])
            if slot is not None:
                self._restore[request.request_id] = slot
                return count
        return 0

    def trim_prefix(self, request: Request, num_pages: int) -> None:
        assert num_pages == 0 or request.request_id in self._restore, "the state kind narrows the prefix last"

    def commit_limit(self, request: Request, target: int) -> int:
        """While the request scores its prompt (prompt_logprobs) its commits stop at the block of its next scored
        position: that block's variants preview the state after exactly the blocks before it, and the slot holds
        only the state after the step's commits (its first position is read from the last committed row, kept
        as the slot's `last_hidden`)."""
        if not request.num_unscored:
            return target
        return max(request.num_computed_tokens, _scored_block_start(request))

    # ---- allocation ----------------------------------------------------------------------------------------
    def can_allocate(self, work: ScheduledRequest) -> bool:
        if work.request.state_slot is not None:
            return True
        return self.pool.can_allocate(keep=self._pinned | {self._restore.get(work.request.request_id)})

    def allocate(self, work: ScheduledRequest) -> ScheduledRequest:
        """Admission takes a slot (restoring the prefix's snapshot); a running sequence may move down; every step
        may take a snapshot."""
        request = work.request
        if request.state_slot is None:
            restore_from = self._restore.pop(request.request_id, None)
            request.state_slot = self.pool.allocate(keep=self._pinned | {restore_from})
            if restore_from is not None:
                self._pinned.add(restore_from)
            work = dataclasses.replace(work, restore_from=restore_from)
        else:
            work = self._moved_down(work)
        return self._with_snapshot(work)

    def _moved_down(self, work: ScheduledRequest) -> ScheduledRequest:
        """`work` with its sequence moved into a lower free slot (`SlotPool.move_down`), when its step commits
        tokens (so a forward runs, and copies the state before reading the slot) and no draft of it waits (a
        draft's kept row is read before the forward, at the slot it was kept in)."""
        request = work.request
        slot = request.state_slot
        if slot is None or work.commit_end == work.commit_start or request.draft.tokens:
            return work
        new = self.pool.move_down(slot)
        if new is None:
            return work
        request.state_slot = new
        return dataclasses.replace(work, move_from=slot)

    def apply(self, work: ScheduledRequest, page_hashes: list[int], num_registered: int) -> None:
        """The snapshot the step took is registered."""
        if work.snapshot is not None and work.snapshot in self._pending:
            self._pending.remove(work.snapshot)
            self.pool.register_snapshot(work.snapshot.slot, work.snapshot.prefix_hash)

    def rollback(self, request: Request, num_pages: int) -> None:
        """Nothing here: a snapshot taken during the draft's commit holds the state after exactly the tokens its
        hash names, so it stays valid (the worker puts the request's own slot back)."""

    def release(self, request: Request) -> None:
        self._restore.pop(request.request_id, None)
        if request.state_slot is not None:
            self.pool.free(request.state_slot)
            request.state_slot = None

    def check_invariants(self) -> None:
        self.pool.check_invariants()

    # ---- snapshots -----------------------------------------------------------------------------------------
    def _with_snapshot(self, work: ScheduledRequest) -> ScheduledRequest:
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

    def _boundary(self, work: ScheduledRequest) -> int | None:
        if not self.pool.enable_snapshots:
            return None
        page, start, end = self.page_size, work.commit_start, work.commit_end
        interval = self.interval_pages * page
        best = end // interval * interval
        prompt_end = work.request.num_prefill_positions // page * page
        if start < prompt_end <= end:
            best = max(best, prompt_end)
        return best if start < best <= end and best > 0 else None

    def _prefix_hash(self, request: Request, num_pages: int) -> int:
        """Chain hash of the request's first `num_pages` pages (those already committed are hashed already)."""
        page = self.page_size
        hashes = request.page_hashes[:num_pages]
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_pages):
            parent = chain_hash(parent, request.known_tokens(i * page, (i + 1) * page))
        assert parent is not None, "a snapshot boundary is after at least one page"
        return parent


def _scored_block_start(request: Request) -> int:
    return request.score_cursor // request.block_length * request.block_length
