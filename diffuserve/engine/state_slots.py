"""The recurrent-state slot pool of hybrid models (GDN layers): slot ids, reference counts, and the prefix
snapshots. Torch-free; the tensors are the executor's (engine/state_cache).

A slot holds one sequence's whole recurrent state (every GDN layer's conv ring and S), whatever its length. A
running sequence owns one slot from admission until it finishes, is aborted or is preempted. A slot can also
hold a *snapshot*: the state of a committed prefix at a page boundary, registered under that prefix's page-chain
hash so that a later request with the same prefix restores it instead of recomputing it. Snapshots are kept
while slots are spare and evicted least recently used first when a sequence needs a slot, exactly as the page
pool treats cached pages.

Invariant: every slot is in exactly one of {free, snapshot (evictable), used}; used slots have a reference,
snapshot slots are registered under one hash, and the hash index maps only to snapshot slots.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Set


class OutOfStateSlots(RuntimeError):
    """`allocate` found no free or evictable slot."""


class StatePool:
    def __init__(self, num_slots: int, slot_bytes: int, enable_snapshots: bool = True) -> None:
        self.num_slots, self.slot_bytes = num_slots, slot_bytes
        self.enable_snapshots = enable_snapshots
        self._free: deque[int] = deque(range(num_slots))
        self._snapshots: OrderedDict[int, int] = OrderedDict()  # slot -> hash, LRU order: oldest first
        self._slot_of: dict[int, int] = {}  # hash -> snapshot slot
        self._used: set[int] = set()
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
            slot = self._free.popleft()
        else:
            victims = [s for s in self._snapshots if s not in keep]
            if not victims:
                raise OutOfStateSlots(f"no free recurrent-state slot ({self.num_slots} in the pool)")
            slot = victims[0]
            self._evict(slot)
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        assert slot in self._used, f"state slot {slot} freed twice or never allocated"
        self._used.remove(slot)
        self._free.append(slot)

    def reserve_snapshot(self, prefix_hash: int) -> int | None:
        """A slot to copy a prefix's state into this step, from the free list only (a snapshot never evicts
        another or takes a running sequence's room). None if snapshots are off, the prefix already has one or no
        slot is free. The slot is used until `register_snapshot`."""
        if not self.enable_snapshots or prefix_hash in self._slot_of or not self._free:
            return None
        slot = self._free.popleft()
        self._used.add(slot)
        return slot

    def register_snapshot(self, slot: int, prefix_hash: int) -> None:
        """The state of the prefix `prefix_hash` is in `slot` (written by the step that reserved it)."""
        self._used.remove(slot)
        if prefix_hash in self._slot_of:  # another sequence registered the same prefix in the same step
            self._free.append(slot)
            return
        self._snapshots[slot] = prefix_hash
        self._slot_of[prefix_hash] = slot
        self.num_snapshots_taken += 1

    def check_invariants(self) -> None:
        free, snaps = set(self._free), set(self._snapshots)
        assert len(free) == len(self._free), "duplicate slot in the free list"
        assert not free & snaps and not free & self._used and not snaps & self._used, "a slot is in two sets"
        assert len(free) + len(snaps) + len(self._used) == self.num_slots, "a slot is lost"
        assert all(self._snapshots[s] == h for h, s in self._slot_of.items()), "hash index out of sync"

    def _evict(self, slot: int) -> None:
        del self._slot_of[self._snapshots.pop(slot)]
        self.num_snapshots_evicted += 1
