"""clover_moe through the engine with recurrent state (state pool, one flattened batch, fused commit advancing
the state, chunked prefill, preemption): at temperature 0 the tokens equal the naive reference decode (threshold
decoder) and the engine that recomputes every prefix each step (every decoder); batching, chunking, preemption
and budgets never change a token."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.baselines.engines import baseline_llm
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode

# Around block (4 / 32), page (16 / 32) and chunk boundaries; the random prompts are seeded.
LENGTHS = {4: [1, 3, 4, 5, 15, 16, 17, 33], 32: [1, 31, 32, 33, 65]}


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 250, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[int, object]:
    root = tmp_path_factory.mktemp("hybrid")
    return {
        block: write_clover_moe_checkpoint(
            root / f"b{block}", make_clover_moe_config(block_length=block), seed=12, init_std=0.1, logit_scale=20.0
        )
        for block in (4, 32)
    }


def _llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), device="cpu", **{"max_model_len": 256, **kwargs})


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


def _params(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **{"threshold": 0.5, **kwargs})


@pytest.mark.parametrize("block", [4, 32])
def test_engine_equals_the_naive_reference(model_dirs, block):
    max_tokens = 9 if block == 4 else 40
    prompts = _prompts(LENGTHS[block])
    llm = _llm(model_dirs[block], max_num_batched_tokens=3 * block)  # prompts over 2 blocks are chunked
    got = _generate(llm, prompts, _params(max_tokens, decoder="threshold"))
    _, model = load_model(model_dirs[block])
    settings = ReferenceSettings(max_new_tokens=max_tokens, threshold=0.5)
    assert got == [reference_block_decode(DenseClover(model), p, settings) for p in prompts]
    assert llm.engine.stats().num_prefill_tokens > 0


@pytest.mark.parametrize("decoder", ["fixed", "entropy", "edit"])
def test_every_decoder_equals_the_recompute_engine(model_dirs, decoder):
    prompts = _prompts(LENGTHS[4], seed=1)
    params = _params(10, decoder=decoder, steps=2, entropy_bound=0.5, edit_threshold=0.6)
    kept = _generate(_llm(model_dirs[4], max_num_batched_tokens=12), prompts, params)
    recompute = baseline_llm(str(model_dirs[4]), "recompute", device="cpu", max_model_len=256)
    assert kept == _generate(recompute, prompts, params)


def test_separate_commit_forwards_equal_the_fused_commit(model_dirs):
    prompts = _prompts([3, 16, 21], seed=7)
    params = _params(13)
    separate = _llm(model_dirs[4], fused_commit=False)
    assert _generate(separate, prompts, params) == _generate(_llm(model_dirs[4]), prompts, params)
    assert separate.engine.stats().num_steps > 0


def test_batched_equals_one_at_a_time(model_dirs):
    prompts = _prompts([1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 20, 24, 31, 33, 40, 6], seed=2)
    params = _params(11)
    batched = _generate(_llm(model_dirs[4], max_num_seqs=18), prompts, params)
    alone = _llm(model_dirs[4], max_num_seqs=1)
    assert batched == [_generate(alone, [p], params)[0] for p in prompts]


def test_chunked_prefill_equals_unchunked(model_dirs):
    prompts = _prompts([33, 47, 64, 70], seed=3)
    params = _params(8)
    whole = _llm(model_dirs[4], max_num_batched_tokens=4096)
    chunked = _llm(model_dirs[4], max_num_batched_tokens=8)
    assert _generate(chunked, prompts, params) == _generate(whole, prompts, params)
    assert chunked.engine.stats().num_steps > whole.engine.stats().num_steps


def _staggered(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """The first prompt alone for two steps (it is decoding by then), then the others arrive."""
    engine, tokens = llm.engine, {}
    engine.add_request("0", prompts[0], params)
    for _ in range(2):
        engine.step()
    for i, prompt in enumerate(prompts[1:], start=1):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        tokens |= {out.request_id: list(out.outputs[0].token_ids) for out in engine.step() if out.finished}
    return [tokens[str(i)] for i in range(len(prompts))]


def test_a_prefill_budget_spreads_prompts_over_steps_without_changing_a_token(model_dirs):
    prompts = _prompts([9, 47, 5, 70], seed=6)
    params = _params(12)
    whole = _llm(model_dirs[4], max_prefill_tokens=4096)
    budgeted = _llm(model_dirs[4], max_prefill_tokens=8)
    expected = _generate(_llm(model_dirs[4]), prompts, params)
    assert _staggered(budgeted, prompts, params) == _staggered(whole, prompts, params) == expected
    assert budgeted.engine.stats().num_steps > whole.engine.stats().num_steps


@pytest.mark.parametrize("budget", [4096, 8])
def test_prefix_cache_hit_equals_miss(model_dirs, budget):
    shared = _prompts([40], seed=4)[0]
    tails = _prompts([3, 9, 17, 1], seed=5)
    prompts = [shared + t for t in tails]
    params = _params(9)
    miss = _generate(_llm(model_dirs[4], enable_prefix_caching=False), prompts, params)
    cached = _llm(model_dirs[4], state_snapshot_interval=1, max_num_batched_tokens=budget)
    hits = [_generate(cached, [p], params)[0] for p in prompts]  # one at a time: each later one can hit
    assert hits == miss
    stats = cached.engine.stats()
    assert stats.state is not None and stats.state.hit_rate > 0 and stats.num_prefix_hit_tokens >= 3 * 32
    assert stats.page_hit_rate >= stats.state.hit_rate


def test_snapshots_evicted_under_slot_pressure_never_change_a_token(model_dirs):
    shared = _prompts([48], seed=8)
    prompts = [shared[0][: 16 * (1 + i % 3)] + t for i, t in enumerate(_prompts([2, 5, 7, 11, 3, 9, 14, 6], 9))]
    params = _params(10)
    miss = _generate(_llm(model_dirs[4], enable_prefix_caching=False), prompts, params)
    slot = _llm(model_dirs[4]).engine.state_pool.slot_bytes
    # 4 slots for up to 3 running requests: snapshots come and go (LRU), hits restore what is left.
    tight = _llm(model_dirs[4], max_num_seqs=3, state_cache_memory=4 * slot, state_snapshot_interval=1)
    got = [_generate(tight, prompts[i : i + 3], params) for i in range(0, len(prompts), 3)]
    assert [t for batch in got for t in batch] == miss
    pool = tight.engine.state_pool
    assert pool.num_snapshots_taken > pool.num_slots and pool.num_snapshots_evicted > 0
    assert tight.engine.stats().state.hit_rate > 0
    pool.check_invariants()


def test_preemption_under_a_kv_and_state_budget_equals_an_unconstrained_run(model_dirs):
    prompts = _prompts([5, 17, 30, 9, 22, 13], seed=6)
    params = _params(24)
    free = _generate(_llm(model_dirs[4]), prompts, params)
    # 8 pages of 16 tokens and 3 state slots for 6 requests of up to 56 positions: some must wait, some are
    # preempted (their state dropped with their pages and recomputed on resume).
    slot = _llm(model_dirs[4]).engine.state_pool.slot_bytes
    tight = _llm(model_dirs[4], num_pages=8, state_cache_memory=3 * slot, enable_prefix_caching=False)
    assert _generate(tight, prompts, params) == free
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0 and stats.state is not None and stats.state.slots_total == 3


def test_a_storm_of_aborts_returns_every_slot_and_page(model_dirs):
    llm = _llm(model_dirs[4], max_num_seqs=8, max_num_batched_tokens=24)
    engine = llm.engine
    free_slots, free_pages = engine.state_pool.num_free_slots, engine.pool.num_free_pages
    for round_index in range(3):
        ids = [f"r{round_index}-{i}" for i in range(12)]
        for request_id, prompt in zip(ids, _prompts([3 + i for i in range(12)], seed=round_index)):
            engine.add_request(request_id, prompt, _params(30))
        for _ in range(2 + round_index):
            engine.step()  # mid-block: some running, some still prefilling or waiting
        assert engine.state_pool.num_used_slots > 0
        for request_id in ids:
            engine.abort_request(request_id)
        engine.step()  # a step after the aborts: nothing left to run
        assert not engine.has_unfinished_requests()
        assert engine.state_pool.num_used_slots == 0
        assert engine.state_pool.num_free_slots == free_slots and engine.pool.num_free_pages == free_pages
        engine.state_pool.check_invariants()
        engine.pool.check_invariants()


def test_a_request_that_cannot_fit_alone_is_refused_with_the_numbers(model_dirs):
    from diffuserve.errors import ContextLengthExceeded

    llm = _llm(model_dirs[4], num_pages=2)
    with pytest.raises(
        ContextLengthExceeded,
        match=r"need 3 KV pages of 16 tokens and one recurrent-state slot of "
        r"[0-9.]+ MiB .*--state-cache-memory.*--kv-cache-memory",
    ):
        llm.engine.add_request("big", [5] * 30, _params(10))


def test_state_budget_too_small_for_one_slot_is_refused(model_dirs):
    with pytest.raises(ValueError, match=r"^state_cache_memory: a budget of 0.0 MiB holds no recurrent-state slot"):
        _llm(model_dirs[4], state_cache_memory=100)


def test_measured_state_per_sequence_equals_the_formula(model_dirs):
    from diffuserve.model.families.clover_moe.config import cache_layout

    engine = _llm(model_dirs[4]).engine
    cache = engine.runner.executor.caches.state
    state_bytes = cache_layout(engine.args, "fp32").state_bytes_per_sequence()  # fp32 checkpoint
    assert cache.state_bytes_per_slot() == state_bytes
    hidden_row = engine.args.hidden_size * 4
    assert engine.state_pool.slot_bytes == state_bytes + hidden_row
    # The state does not grow with context; only the K/V pages (attention layers only) do.
    long = _llm(model_dirs[4], max_model_len=1024).engine
    assert long.runner.executor.caches.state.state_bytes_per_slot() == cache.state_bytes_per_slot()
    assert len(long.runner.executor.caches.paged["kv"].k_caches) == 1  # 4 layers: 3 GDN + 1 attention


def test_routing_statistics_are_recorded_for_hybrid_models(model_dirs):
    """The hybrid runner records the MoE routing as the paged one does (bench and /metrics read it)."""
    llm = _llm(model_dirs[4], expert_stats=True)
    _generate(llm, _prompts([3, 9]), _params(12))
    experts = llm.engine.stats().experts
    assert experts is not None
    assert 1 <= experts.experts_touched_per_block <= experts.num_experts
    assert 1 <= experts.experts_touched_per_step <= experts.num_experts


def test_expert_offload_gives_the_same_tokens(model_dirs):
    """Clover's routed experts in host memory behind a 2-slot device cache per layer: same tokens, and the cache
    really missed (experts fetched or computed on the host)."""
    prompts = _prompts([3, 8, 13, 18])
    expected = _generate(_llm(model_dirs[4]), prompts, _params(24))
    offloaded = _llm(model_dirs[4], expert_offload=True, expert_stats=True)
    assert _generate(offloaded, prompts, _params(24)) == expected
    stats = offloaded.engine.stats().offload
    assert stats is not None and stats.misses > 0 and stats.bytes_moved > 0


@pytest.mark.parametrize(
    "budget, message",
    [
        (
            8,
            "max_prefill_tokens: 8 is below the block length 32 (prefill runs in whole blocks); "
            "raise it to at least 32",
        ),
        (0, "max_prefill_tokens: must be > 0, got 0"),
    ],
)
def test_a_prefill_budget_below_one_block_is_refused_with_the_fix(model_dirs, budget, message):
    with pytest.raises(ValueError) as refused:
        _llm(model_dirs[32], max_prefill_tokens=budget)
    assert str(refused.value) == message
