"""The page groups' step metadata (worker/cache/paged_step.py), built for the whole step in a few tensor ops, against
the obviously-correct per-request version written here: each request's key slots and slot mapping read position by
position from its page table, and its mask cell by cell from the rules, for random batches of requests (fused
commits and blocks, prefill chunks, commits alone), scoring variants between them, full-attention and
sliding-window groups."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.core.cache.paged import FREED
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.model.interface import StepRules
from diffuserve.model.layers.attention import SequenceSlice
from diffuserve.sampling_params import SamplingParams
from diffuserve.worker.cache.paged_step import PagedMetadataBuilder, WindowMetadataBuilder

BLOCK, MASK = 4, 999
RULES = {
    "block-causal": StepRules(),
    "causal-commits": StepRules(causal_commits=True),
    "autoregressive": StepRules(causal_commits=True, autoregressive=True),
    "window-from-block-start": StepRules(causal_commits=True, block_window_from_start=True),
}


def _work(rng: random.Random, index: int, page_size: int, window: int | None) -> ScheduledRequest:
    """A request with a random page table and random work: its block at a random place, commits before it."""
    block_start = BLOCK * rng.randrange(0, 12)
    params = SamplingParams(max_tokens=64).with_defaults({})
    request = Request(f"r{index}", [1] * (block_start + 1), params, BLOCK, MASK)
    request.block_start = block_start
    has_block = rng.random() < 0.8
    commit_end = block_start if has_block else block_start + BLOCK
    commit_start = max(0, commit_end - BLOCK * rng.choice([0, 0, 1, 2, 3] if has_block else [1, 2, 3]))
    if not has_block and rng.random() < 0.4:  # one or two commit tokens (autoregressive steps): short queries
        commit_start = commit_end - rng.choice([1, 2])
    end = request.block_end if has_block else commit_end
    pages = rng.sample(range(100), -(-end // page_size) + rng.randrange(0, 2))  # maybe a page past the queries
    if window is not None:  # pages wholly behind the window of the first query are gone
        gone = max(0, commit_start - window) // page_size
        pages[:gone] = [FREED] * gone
    request.pages["g"] = pages
    return ScheduledRequest(request, commit_start, commit_end, has_block)


def _expected_mask(work: ScheduledRequest, rules: StepRules, first: int, window: int | None) -> list[list[bool]]:
    num_commit = work.commit_end - work.commit_start
    rows = []
    for row, q in enumerate(range(work.query_start, work.query_end)):
        in_block = row >= num_commit
        cells = []
        for k in range(first, work.query_end):
            if not rules.causal_commits:
                seen = q // BLOCK >= k // BLOCK
            else:
                seen = k <= q or (in_block and not rules.autoregressive)
            if window is not None:
                anchor = work.request.block_start if in_block and rules.block_window_from_start else q
                seen = seen and anchor - k < window
            cells.append(seen)
        rows.append(cells)
    return rows


def _variant(rng: random.Random, first_row: int) -> tuple[torch.Tensor, SequenceSlice]:
    """A scoring variant as prompt scoring lays it out: its own slot mapping and sequence."""
    slots = torch.tensor(rng.sample(range(1000, 2000), BLOCK))
    keys = torch.tensor(rng.sample(range(1000, 2000), 2 * BLOCK))
    return slots, SequenceSlice.of(first_row, BLOCK, keys, torch.ones(BLOCK, 2 * BLOCK, dtype=torch.bool))


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window"])
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("page_size", [4, 6, 8])  # 6: a kept window that starts inside a block
def test_step_metadata_is_the_per_request_layout(rules, page_size, window):
    if window is None and rules.block_window_from_start:
        pytest.skip("the block's window only applies to a window group")
    rng = random.Random(page_size * 7 + len(str(rules)) + (window or 0))
    for trial in range(6):
        device = torch.device("cpu")
        builder = (
            PagedMetadataBuilder("g", page_size, BLOCK, rules, device)
            if window is None
            else WindowMetadataBuilder("g", window, page_size, BLOCK, rules, device)
        )
        expected_mapping: list[int] = []
        expected: list[tuple[int, int, list[int], list[list[bool]] | None] | tuple[torch.Tensor, SequenceSlice]] = []
        row = 0
        for i in range(rng.randrange(1, 9)):
            if rng.random() < 0.25:  # a scoring variant before this request
                slots, sequence = _variant(rng, row)
                builder.add_sequence(slots, sequence)
                expected_mapping += slots.tolist()
                expected.append((slots, sequence))
                row += BLOCK
            work = _work(rng, i, page_size, window)
            pages = work.request.pages["g"]
            builder.add(work, row)
            first = 0 if window is None else next(j for j, p in enumerate(pages) if p != FREED) * page_size
            slot = [pages[p // page_size] * page_size + p % page_size for p in range(work.query_end)]
            expected_mapping += slot[work.query_start :]
            mask = _expected_mask(work, rules, first, window)
            all_seen = all(all(cells) for cells in mask)
            expected.append((row, work.num_tokens, slot[first:], None if all_seen and window is None else mask))
            row += work.num_tokens
        meta = builder.build()
        assert meta.slot_mapping.dtype == torch.long
        assert meta.slot_mapping.tolist() == expected_mapping, trial
        assert len(meta.sequences) == len(expected)
        for got, want in zip(meta.sequences, expected, strict=True):
            if isinstance(want[0], torch.Tensor):
                assert got is want[1]
                continue
            first_row, num_tokens, keys, mask = want
            assert (got.query_start, got.query_len) == (first_row, num_tokens)
            assert got.key_slots.tolist() == keys
            if mask is None:
                assert got.mask is None
            else:
                assert got.mask is not None and got.mask.tolist() == mask


def test_an_empty_step_has_no_slots():
    meta = PagedMetadataBuilder("g", 4, BLOCK, StepRules(), torch.device("cpu")).build()
    assert meta.slot_mapping.dtype == torch.long and meta.slot_mapping.numel() == 0 and meta.sequences == ()


def test_moved_metadata_pickles_every_key_slot_once():
    """The step travels to the other ranks pickled: its own sequences share one key tensor, which moves once and
    holds exactly their pages' key slots (no larger tensor it would be a view of); a scoring variant's keys move
    alone."""
    builder = PagedMetadataBuilder("g", 4, BLOCK, StepRules(), torch.device("cpu"))
    rng = random.Random(0)
    for i in range(8):
        builder.add(_work(rng, i, 4, None), first_row=0)
    builder.add_sequence(*_variant(rng, first_row=0))
    built = builder.build()
    moved = built.to("cpu")
    own = moved.sequences[:8]
    assert all(s.keys is own[0].keys for s in own)
    pages_slots = sum(-(-s.num_keys // 4) * 4 for s in own)  # page size 4: each sequence's whole pages
    assert own[0].keys.untyped_storage().nbytes() == own[0].keys.nbytes == 8 * pages_slots
    assert moved.sequences[8].keys is not own[0].keys
    for after, before in zip(moved.sequences, built.sequences, strict=True):
        assert torch.equal(after.key_slots, before.key_slots) and after.keys is not before.keys
