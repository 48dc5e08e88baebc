"""Scheduler, torch-free: budgets, chunked prefill by whole blocks, fused commits, preemption of the youngest,
prefix reuse, aborts, and no page leaks. Requests are driven by a fake "decoder" that fills a block per step."""

from __future__ import annotations

import random

import pytest

from diffuserve.core.cache.manager import CacheManager
from diffuserve.core.cache.paged import PagedKind, PagePool
from diffuserve.core.request import Request, RequestStatus
from diffuserve.core.scheduler import Scheduler
from diffuserve.core.writes import BlockWrite
from diffuserve.errors import ContextLengthExceeded
from diffuserve.sampling_params import SamplingParams

MASK = 999


def make_request(rid: str, prompt_len: int, max_tokens: int = 8, block: int = 4, first_token: int = 1) -> Request:
    prompt = [(first_token + i) % 50 for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens).with_defaults({}), block, MASK)


def make_scheduler(
    num_pages=64, page_size=4, max_num_seqs=8, budget=64, block=4, fused=True, prefill_budget=None
) -> Scheduler:
    cache = CacheManager([PagedKind("kv", PagePool(num_pages, page_size))])
    return Scheduler(cache, max_num_seqs, budget, block, fused, max_prefill_tokens=prefill_budget)


def run_step(scheduler: Scheduler) -> list:
    """One step: a fake forward fills every scheduled block completely (one step per block)."""
    out = scheduler.schedule()
    accepted = {w.request.request_id: BlockWrite([(i, 7) for i in w.request.masked_indices()]) for w in out.scheduled}
    scheduler.update_from_output(out, accepted)
    scheduler.cache.pool.check_invariants()
    return out.scheduled


def drain(scheduler: Scheduler, max_steps: int = 500) -> int:
    steps = 0
    while scheduler.has_unfinished:
        run_step(scheduler)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def test_long_prompt_is_prefilled_in_whole_block_chunks_then_fused_with_the_first_block():
    scheduler = make_scheduler(budget=16)
    request = make_request("a", prompt_len=41)  # 10 complete blocks + 1 prompt token in the current block
    scheduler.add(request)
    chunks = [(w.commit_start, w.commit_end, w.has_block) for w in run_step(scheduler)]
    assert chunks == [(0, 16, False)]
    assert [(w.commit_start, w.commit_end, w.has_block) for w in run_step(scheduler)] == [(16, 32, False)]
    assert [(w.commit_start, w.commit_end, w.has_block) for w in run_step(scheduler)] == [(32, 40, True)]
    # the finished block is committed in the same forward as the next block's first step
    assert [(w.commit_start, w.commit_end, w.has_block) for w in run_step(scheduler)] == [(40, 44, True)]


def test_a_steps_token_count_is_taken_when_it_is_scheduled():
    scheduler = make_scheduler()
    scheduler.add(make_request("a", prompt_len=2, max_tokens=12))
    out = scheduler.schedule()
    assert out.num_batched_tokens == 4
    update = scheduler.update_from_output(out, {"a": BlockWrite([(2, 7), (3, 7)])})
    assert update.finished_blocks == ["a"] and update.new_token_counts == {"a": 2}
    assert out.num_batched_tokens == 4  # the request's block moved on; the step's count did not


def test_separate_commit_runs_its_own_forward():
    scheduler = make_scheduler(fused=False)
    scheduler.add(make_request("a", prompt_len=4, max_tokens=12))
    shapes = [[(w.commit_start, w.commit_end, w.has_block) for w in run_step(scheduler)] for _ in range(4)]
    assert shapes == [[(0, 4, True)], [(4, 8, False)], [(8, 8, True)], [(8, 12, False)]]


def test_budget_rotates_among_running_requests():
    scheduler = make_scheduler(budget=8, max_num_seqs=4)
    for i in range(2):
        scheduler.add(make_request(str(i), prompt_len=2, max_tokens=40))
    assert len(run_step(scheduler)) == 2  # both admitted: 4 block tokens each
    # now each needs 8 (fused commit + block): one per step, least recently scheduled first
    turns = [[w.request.request_id for w in run_step(scheduler)] for _ in range(4)]
    assert turns == [["0"], ["1"], ["0"], ["1"]]


def test_prefill_budget_bounds_each_steps_prompt_tokens_and_never_stalls_the_running_requests():
    """Under a prefill budget of 8, three 20-token prompts arrive beside a running request: no step prefills more
    than 8 prompt tokens while it decodes, and its block is decoded in every step (its fused commit of the block it
    finished is not prefill)."""
    scheduler = make_scheduler(budget=64, prefill_budget=8)
    running = make_request("run", prompt_len=4, max_tokens=24)
    scheduler.add(running)
    run_step(scheduler)
    for i in range(3):
        scheduler.add(make_request(f"new{i}", prompt_len=20, max_tokens=4, first_token=10 * i + 5))
    prefills, beside_a_commit = [], []
    while scheduler.has_unfinished:
        scheduled = run_step(scheduler)
        prefills.append(sum(w.commit_end - w.commit_start for w in scheduled if w.request is not running))
        if not running.status.is_finished:
            assert prefills[-1] <= 8
            (own,) = [w for w in scheduled if w.request is running]
            assert own.has_block
            if own.commit_end > own.commit_start:
                beside_a_commit.append(prefills[-1])
    assert max(beside_a_commit) == 8 and sum(prefills) >= 3 * 20


def test_a_request_still_denoising_its_first_block_counts_as_decoding():
    """A block decoded over several steps (one token a step here): while the first one is open, nothing is left to
    commit, and the request is decoding, so an arrival's prefill stays within the budget."""
    scheduler = make_scheduler(budget=64, prefill_budget=8)
    running = make_request("run", prompt_len=6, max_tokens=8)
    scheduler.add(running)
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"run": BlockWrite([(running.masked_indices()[0], 7)])})
    assert running.block_start == 4 and running.num_computed_tokens == 4  # its first block is still open
    scheduler.add(make_request("new", prompt_len=20, first_token=9))
    new_work = [w for w in scheduler.schedule().scheduled if w.request.request_id == "new"]
    assert [w.commit_end - w.commit_start for w in new_work] == [8]


@pytest.mark.parametrize("prefill_budget", [None, 8])
def test_with_no_request_decoding_prefill_takes_the_whole_step(prefill_budget):
    scheduler = make_scheduler(budget=128, prefill_budget=prefill_budget)
    for i in range(3):
        scheduler.add(make_request(f"new{i}", prompt_len=20, max_tokens=4, first_token=10 * i + 5))
    assert sum(w.commit_end - w.commit_start for w in run_step(scheduler)) == 3 * 20


def test_preemption_frees_the_youngest_and_everything_completes():
    scheduler = make_scheduler(num_pages=12, page_size=4, budget=64)
    requests = [make_request(str(i), prompt_len=10, max_tokens=24) for i in range(6)]
    for r in requests:
        scheduler.add(r)
    drain(scheduler)
    assert scheduler.num_preemptions > 0
    assert all(r.status.is_finished and len(r.output_token_ids) == 24 for r in requests)
    assert scheduler.cache.pool.num_free_pages == scheduler.cache.pool.num_pages


def test_request_larger_than_the_cache_is_rejected():
    scheduler = make_scheduler(num_pages=4, page_size=4)
    message = r"max_tokens: prompt \(10 tokens\) \+ max_tokens \(20\) need 8 KV pages of 4 tokens, the cache has 4"
    with pytest.raises(ContextLengthExceeded, match=message) as error:
        scheduler.add(make_request("big", prompt_len=10, max_tokens=20))
    assert error.value.param == "max_tokens" and error.value.code == "context_length_exceeded"
    assert "--num-pages" in str(error.value)
    with pytest.raises(ContextLengthExceeded) as error:  # not even the prompt fits: the prompt is at fault
        scheduler.add(make_request("huge", prompt_len=16, max_tokens=4))
    assert error.value.param == "prompt"
    assert not scheduler.has_unfinished and not scheduler.requests


def test_step_results_finish_requests_on_stop_ids_and_length():
    scheduler = make_scheduler()
    stops = SamplingParams(max_tokens=8, stop_token_ids=[7]).with_defaults({})
    stopping = Request("stop", [1, 2, 3, 4, 5], stops, 4, MASK)  # its first generated token is the stop id 7
    long = make_request("long", prompt_len=2, max_tokens=6)
    for request in (stopping, long):
        scheduler.add(request)
    finished = []
    while scheduler.has_unfinished:
        out = scheduler.schedule()
        accepted = {
            w.request.request_id: BlockWrite(
                [(i, 7 if w.request is stopping else 9) for i in w.request.masked_indices()]
            )
            for w in out.scheduled
        }
        update = scheduler.update_from_output(out, accepted)
        finished += [(r.request_id, r.status, r.output_token_ids, r.stop_reason) for r in update.finished]
    assert finished == [
        ("stop", RequestStatus.FINISHED_STOPPED, [7], 7),
        ("long", RequestStatus.FINISHED_LENGTH, [9] * 6, None),
    ]
    assert scheduler.cache.pool.num_free_pages == scheduler.cache.pool.num_pages


def test_prefix_is_reused_by_a_later_request():
    scheduler = make_scheduler(page_size=8, budget=256)
    scheduler.add(make_request("a", prompt_len=37))
    drain(scheduler)
    second = make_request("b", prompt_len=37)
    second.prompt_token_ids[-3:] = [40, 41, 42]  # same 34-token prefix, different tail
    second.open_block(36)
    scheduler.add(second)
    first_work = run_step(scheduler)[0]
    assert first_work.commit_start == 32  # 4 full pages of 8 reused, only the rest computed
    assert scheduler.prefix_hit_rate > 0


def test_abort_frees_pages_at_once():
    scheduler = make_scheduler()
    request = make_request("a", prompt_len=20, max_tokens=30)
    scheduler.add(request)
    run_step(scheduler)
    assert request.page_ids
    assert scheduler.finish_requests(["a", "unknown"], RequestStatus.FINISHED_ABORTED) == [request]
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.cache.pool.num_free_pages == scheduler.cache.pool.num_pages and not scheduler.has_unfinished
    assert scheduler.finish_requests(["a"], RequestStatus.FINISHED_ERROR) == []  # finished once only


@pytest.mark.parametrize("seed", range(4))
def test_random_workloads_never_deadlock_or_leak(seed):
    rng = random.Random(seed)
    scheduler = make_scheduler(
        num_pages=rng.randint(10, 30),
        page_size=4,
        budget=rng.choice([8, 16, 64]),
        max_num_seqs=rng.randint(1, 6),
        prefill_budget=rng.choice([None, 4, 12]),
    )
    requests = [
        make_request(str(i), rng.randint(1, 20), rng.randint(1, 16), first_token=rng.randint(0, 3)) for i in range(20)
    ]
    for r in requests:
        scheduler.add(r)
    drain(scheduler, max_steps=2000)
    assert all(r.status.is_finished for r in requests)
    assert scheduler.cache.pool.num_free_pages == scheduler.cache.pool.num_pages


def test_prompt_scoring_rides_with_the_commits_it_needs_and_the_block_waits_for_it():
    """A 13-token prompt (positions 1..12 scored, 4 tokens a variant) under a budget of 16: each step commits
    what its variants read (a variant of block b needs blocks < b committed by that forward), scratch pages are
    lent for the step only, and the block starts once the whole prompt is scored."""
    scheduler = make_scheduler(budget=16)
    prompt = list(range(13))
    request = Request("a", prompt, SamplingParams(max_tokens=4, prompt_logprobs=1).with_defaults({}), 4, MASK)
    scheduler.add(request)
    plans = []
    while request.status is not RequestStatus.FINISHED_LENGTH:
        out = scheduler.schedule()
        work = out.scheduled[0]
        plans.append((work.commit_start, work.commit_end, work.score_start, work.score_end, work.has_block))
        assert len(request.score_page_ids) == -(-work.num_score_tokens // 4)
        assert out.num_batched_tokens == work.num_tokens + work.num_score_tokens <= 16
        written = BlockWrite([(i, 7) for i in request.masked_indices()])
        scheduler.update_from_output(out, {"a": written} if work.has_block else {})
        assert request.score_page_ids == []
        scheduler.cache.pool.check_invariants()
    assert plans == [
        (0, 12, 1, 2, False),  # three prompt blocks committed, one variant in the 4 tokens left
        (12, 12, 2, 6, False),
        (12, 12, 6, 10, False),
        (12, 12, 10, 13, True),  # the last variants, and the block in the same forward
        (12, 16, 13, 13, True),
    ]
    assert scheduler.cache.pool.num_free_pages == scheduler.cache.pool.num_pages


def test_max_tokens_zero_commits_only_what_scoring_reads_and_finishes_without_a_block():
    scheduler = make_scheduler(budget=64)
    scored = Request("s", list(range(12)), SamplingParams(max_tokens=0, prompt_logprobs=0).with_defaults({}), 4, MASK)
    plain = Request("p", list(range(12)), SamplingParams(max_tokens=0).with_defaults({}), 4, MASK)
    scheduler.add(scored)
    scheduler.add(plain)
    out = scheduler.schedule()
    assert [(w.commit_end, w.score_start, w.score_end, w.has_block) for w in out.scheduled] == [
        (8, 1, 12, False),
        (0, 1, 1, False),
    ]
    update = scheduler.update_from_output(out, {})
    assert update.finished == [scored, plain] and scored.output_token_ids == plain.output_token_ids == []
    assert not scheduler.has_unfinished
