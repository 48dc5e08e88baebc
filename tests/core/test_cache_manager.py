"""The cache manager and its kinds, torch-free except the window metadata check: a sliding-window page group frees
what no later query can see, reuses a prefix only where it still holds the window behind it, and stays bounded
while the scheduler drives it; the manager combines the kinds' answers (fit, prefix, room) and leaks nothing."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.core.cache.manager import CacheManager
from diffuserve.core.cache.paged import FREED, PagedKind, PagePool
from diffuserve.core.cache.recurrent import RecurrentKind, SlotPool
from diffuserve.core.request import Request
from diffuserve.core.scheduler import Scheduler
from diffuserve.core.step import ScheduledRequest
from diffuserve.core.writes import BlockWrite
from diffuserve.errors import ContextLengthExceeded
from diffuserve.model.interface import StepRules
from diffuserve.sampling_params import SamplingParams
from diffuserve.worker.cache.paged_step import WindowMetadataBuilder

MASK, BLOCK, PAGE = 999, 4, 4


def _request(rid: str, prompt_len: int, max_tokens: int = 8, first: int = 1) -> Request:
    prompt = [(first + i) % 50 for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens).with_defaults({}), BLOCK, MASK)


def _manager(num_pages: int = 64, window: int | None = None, window_pages: int = 64, slots: int = 0) -> CacheManager:
    kinds = [PagedKind("kv", PagePool(num_pages, PAGE))]
    if window is not None:
        kinds.append(PagedKind("win", PagePool(window_pages, PAGE), window=window, max_span=16))
    if slots:
        kinds.append(RecurrentKind(SlotPool(slots, slot_bytes=1), PAGE, interval_pages=1))
    return CacheManager(kinds)


def _drain(scheduler: Scheduler, watch=lambda: None, max_steps: int = 2000) -> None:
    steps = 0
    while scheduler.has_unfinished:
        out = scheduler.schedule()
        writes = {w.request.request_id: BlockWrite([(i, 7) for i in w.request.masked_indices()]) for w in out.scheduled}
        scheduler.update_from_output(out, writes)
        scheduler.cache.check_invariants()
        watch()
        steps += 1
        assert steps < max_steps, "no progress"


def test_a_window_group_frees_the_pages_behind_the_window():
    manager = _manager(window=8)
    request = _request("a", prompt_len=40)
    work = manager.allocate(ScheduledRequest(request, 0, 40, True))
    assert len(request.pages["win"]) == 11 and FREED not in request.pages["win"]  # 44 positions up to the block
    manager.apply(work)
    # The next queries start at 40 and see back to 33: pages 0..7 (positions < 32) are freed.
    assert request.pages["win"][:8] == [FREED] * 8 and FREED not in request.pages["win"][8:]
    assert manager.kinds[1].pool.num_free_pages == 64 - 3
    assert len(request.page_ids) == 11 and FREED not in request.page_ids  # the full-attention pages all stay
    manager.release(request)
    manager.check_invariants()
    assert manager.kinds[1].pool.num_free_pages == 64 and manager.pool.num_free_pages == 64


def test_a_window_prefix_hit_needs_only_the_window_behind_it():
    manager = _manager(window=8)
    first = _request("a", prompt_len=41)
    manager.apply(manager.allocate(ScheduledRequest(first, 0, 40, True)))
    manager.release(first)  # its committed pages stay cached (evictable), the freed window pages too
    second = _request("b", prompt_len=41)
    manager.match_prefix(second)
    assert second.num_computed_tokens == 40
    assert len(second.pages["win"]) == 10 and second.pages["win"][:7] == [FREED] * 7  # positions 28.. kept
    manager.release(second)
    # Evict the cached window pages the hit needs: the full-attention pages alone no longer make a hit.
    win_pool = manager.kinds[1].pool
    win_pool.free(win_pool.allocate(64))
    third = _request("c", prompt_len=41)
    manager.match_prefix(third)
    assert third.num_computed_tokens == 0 and third.pages["kv"] == []
    manager.release(third)
    manager.check_invariants()


def test_the_scheduler_drives_a_window_group_within_its_bound():
    manager = _manager(num_pages=256, window=8, window_pages=48)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=16, block_length=BLOCK)
    rng = random.Random(0)
    for i in range(10):
        scheduler.add(_request(str(i), rng.randint(1, 60), max_tokens=rng.randint(1, 40), first=i))
    most = [0]

    def watch() -> None:
        win = manager.kinds[1].pool
        most[0] = max(most[0], win.num_pages - win.num_free_pages)

    _drain(scheduler, watch)
    # 4 sequences x (window 8 + span 16 + a block), in pages: far below the full-attention pages they would hold.
    assert 0 < most[0] <= 4 * (-(-(8 + 16) // PAGE) + 2)
    assert manager.kinds[1].pool.num_free_pages == 48 and manager.pool.num_free_pages == 256


def test_the_state_kind_narrows_a_prefix_hit_to_its_snapshot_and_needs_a_slot():
    manager = _manager(slots=2)
    first = _request("a", prompt_len=13)  # prompt blocks 0..11: a snapshot at 12 (the prompt's last page boundary)
    work = manager.allocate(ScheduledRequest(first, 0, 12, True))
    assert first.state_slot is not None and work.snapshot is not None and work.snapshot.position == 12
    manager.apply(work)
    manager.release(first)
    second = _request("b", prompt_len=13)
    manager.match_prefix(second)
    assert second.num_computed_tokens == 12  # pages and the snapshot after them
    manager.release(second)
    # A 12-token prompt's block starts with a generated position, predicted from row 11 under the AR shift: the
    # hit must stop before it, where no snapshot exists, so the cached pages are not used either.
    third = _request("c", prompt_len=12)
    manager.match_prefix(third)
    assert third.num_computed_tokens == 0 and third.page_ids == []
    manager.release(third)
    busy = [_request(str(i), 2) for i in range(2)]
    for request in busy:
        manager.allocate(ScheduledRequest(request, 0, 0, True))
    assert not manager.can_allocate(ScheduledRequest(_request("c", 2), 0, 0, True))  # both slots held
    for request in busy:
        manager.release(request)
    manager.check_invariants()


def test_check_fits_names_every_kind_it_needs():
    manager = _manager(num_pages=4, slots=1)
    with pytest.raises(ContextLengthExceeded, match=r"need 8 KV pages of 4 tokens and one recurrent-state slot"):
        manager.check_fits(_request("a", prompt_len=10, max_tokens=20))
    manager.check_fits(_request("b", prompt_len=4, max_tokens=8))


@pytest.mark.parametrize("rules", [StepRules(), StepRules(causal_commits=True)], ids=["block-causal", "causal"])
def test_window_masks_are_the_rule_and_the_window(rules):
    builder = WindowMetadataBuilder("win", 6, PAGE, BLOCK, rules, torch.device("cpu"))
    request = _request("a", prompt_len=21)
    request.pages["win"] = [FREED, FREED, 5, 6, 7, 8]  # positions 8.. kept
    work = ScheduledRequest(request, 16, 20, True)  # commits 16..19, then the block 20..23
    builder.add(work, first_row=0)
    sequence = builder.build().sequences[0]
    keys = range(8, 24)
    assert sequence.key_slots.tolist() == [5 * PAGE + k % PAGE + (k // PAGE - 2) * PAGE for k in keys]
    for row, q in enumerate(range(16, 24)):
        for column, k in enumerate(keys):
            causal = k <= q or q >= 20  # commit rows causal; block rows see the commits and the whole block
            visible = causal if rules.causal_commits else q // BLOCK >= k // BLOCK
            assert bool(sequence.mask[row, column]) == (visible and q - k < 6), (q, k)
