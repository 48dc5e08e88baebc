"""State slot pool (torch-free): a slot per running sequence, snapshots only in spare slots, LRU eviction that
never takes a snapshot being restored, random operation sequences keep the invariants; the scheduler's snapshot
boundaries; /metrics shows the slots and both hit rates."""

from __future__ import annotations

import random

import pytest

from diffuserve.core.cache.recurrent import OutOfStateSlots, RecurrentKind, SlotPool
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.sampling_params import SamplingParams


def test_slots_are_allocated_and_freed():
    pool = SlotPool(num_slots=2, slot_bytes=100)
    a, b = pool.allocate(), pool.allocate()
    assert {a, b} == {0, 1} and pool.num_used_slots == 2 and not pool.can_allocate()
    with pytest.raises(OutOfStateSlots):
        pool.allocate()
    pool.free(a)
    assert pool.num_free_slots == 1 and pool.allocate() == a
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(b) or pool.free(b)
    pool.check_invariants()


def test_snapshots_use_spare_slots_and_are_evicted_lru_but_never_while_restored():
    pool = SlotPool(num_slots=3, slot_bytes=100)
    running = pool.allocate()
    first, second = pool.reserve_snapshot(11), pool.reserve_snapshot(22)
    assert pool.reserve_snapshot(33) is None  # no spare slot: a snapshot never evicts
    pool.register_snapshot(first, 11)
    pool.register_snapshot(second, 22)
    assert pool.num_snapshots == 2 and pool.num_free_slots == 2  # snapshots count as free
    assert pool.reserve_snapshot(11) is None  # already cached
    assert pool.lookup(11) == first  # refreshed: 22 is now the least recently used
    assert pool.allocate(keep={None}) == second
    assert pool.lookup(22) is None and pool.num_snapshots_evicted == 1
    assert not pool.can_allocate(keep={first})  # the one snapshot left is being restored
    pool.free(running)
    assert pool.allocate(keep={first}) == running
    pool.check_invariants()


def test_snapshots_off_reserves_nothing():
    pool = SlotPool(num_slots=2, slot_bytes=100, enable_snapshots=False)
    assert pool.reserve_snapshot(1) is None


def test_random_operations_keep_the_invariants():
    rng = random.Random(0)
    pool = SlotPool(num_slots=6, slot_bytes=1)
    held: list[int] = []
    for _ in range(2000):
        op, keep = rng.random(), {pool.lookup(rng.randrange(8))}
        if op < 0.4 and pool.can_allocate(keep):
            held.append(pool.allocate(keep))
        elif op < 0.7 and held:
            pool.free(held.pop(rng.randrange(len(held))))
        elif (slot := pool.reserve_snapshot(rng.randrange(8))) is not None:
            pool.register_snapshot(slot, rng.randrange(8))
        pool.check_invariants()
    for slot in held:
        pool.free(slot)
    assert pool.num_free_slots == pool.num_slots


def test_metrics_show_state_slots_and_both_hit_rates():
    from diffuserve.core.cache.recurrent import StateStats
    from diffuserve.engine.engine_stats import EngineStats
    from diffuserve.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")
    stats = EngineStats(
        1,
        0,
        0.5,
        0.25,
        0,
        3,
        10,
        4,
        8,
        0.1,
        8,
        32,
        page_hit_rate=0.5,
        state=StateStats(slots_used=1, slots_total=8, num_snapshots=2, slot_bytes=64, hit_rate=0.25),
    )
    metrics.engine_stats(stats)
    text = metrics.render().decode()
    for line in (
        'diffuserve:state_slots_used{model_name="m"} 1.0',
        'diffuserve:state_slots_total{model_name="m"} 8.0',
        'diffuserve:prefix_cache_page_hit_rate{model_name="m"} 0.5',
        'diffuserve:prefix_cache_state_hit_rate{model_name="m"} 0.25',
        'diffuserve:state_prefix_snapshots{model_name="m"} 2.0',
    ):
        assert line in text


def test_sequences_take_the_lowest_free_slot_and_snapshots_the_highest():
    """Sequences admitted together hold one range of slots, in admission order (the GDN layers then advance them
    in place, model/families/clover_moe/gdn_step)."""
    pool = SlotPool(num_slots=6, slot_bytes=100)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    assert pool.reserve_snapshot(11) == 5
    pool.free(1)
    pool.free(0)
    assert [pool.allocate(), pool.allocate(), pool.allocate()] == [0, 1, 3]
    pool.check_invariants()


def test_only_sequences_above_the_range_move_down_into_the_lowest_free_slot():
    pool = SlotPool(num_slots=8, slot_bytes=100)
    held = [pool.allocate() for _ in range(5)]  # 0..4
    snapshot = pool.reserve_snapshot(11)
    assert snapshot == 7
    pool.free(held[1])
    pool.free(held[2])  # sequences at 0, 3, 4: the range is [0, 3)
    assert pool.move_down(0) is None  # inside the range
    assert pool.move_down(3) == 1  # above it: the lowest free slot
    assert pool.move_down(4) == 2
    assert pool.move_down(1) is None and pool.move_down(2) is None  # the range is whole again
    assert sorted(pool._sequences) == [0, 1, 2] and snapshot in pool._used
    assert pool.allocate() == 3
    pool.free(0)  # 1, 2, 3: only the one above the range moves, not every sequence above the hole
    assert pool.move_down(1) is None and pool.move_down(2) is None and pool.move_down(3) == 0
    pool.check_invariants()


def test_a_running_sequence_moves_down_only_in_a_step_that_commits_and_has_no_draft():
    """The move is copied by the step's forward: a step without commit rows may run none, and a draft's kept row
    is read before the forward at the slot it was kept in."""
    kind = RecurrentKind(SlotPool(4, slot_bytes=1, enable_snapshots=False), page_size=4, interval_pages=1)
    low, high = (Request(r, [1, 2, 3], SamplingParams(max_tokens=8).with_defaults({}), 4, 999) for r in "ab")
    for request in (low, high):
        kind.allocate(ScheduledRequest(request, 0, 3, True))
    kind.release(low)  # high (slot 1) is now above the range [0, 1)
    assert kind.allocate(ScheduledRequest(high, 4, 4, True)).move_from is None  # no commit rows
    high.draft.tokens = [7, 7, 7, 7]
    assert kind.allocate(ScheduledRequest(high, 4, 8, True)).move_from is None  # a draft waits
    high.draft.tokens = []
    moved = kind.allocate(ScheduledRequest(high, 4, 8, True))
    assert (moved.move_from, high.state_slot) == (1, 0)
    kind.check_invariants()
