"""Expert offload: the same tokens with and without it (sdar and LLaDA2 families, both residency policies), the
cache accounting on a hand-checked case, and the cost model's choice between fetching and host compute."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.layers.moe.dispatch import group_by_expert, grouped_experts
from diffuserve.model.layers.moe.expert_cache import ExpertCache, OffloadCounters
from diffuserve.model.layers.moe.offload import OffloadCostModel, OffloadedExperts
from diffuserve.model.layers.moe.offload_context import BlockRef, OffloadContext, offload_context
from diffuserve.worker.experts import num_cache_slots

ALWAYS_FETCH = OffloadCostModel(link_bytes_per_s=1e12, host_flops_per_s=1.0)
ALWAYS_HOST = OffloadCostModel(link_bytes_per_s=1.0, host_flops_per_s=1e18)
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True, threshold=0.7)


def _prompts() -> list[dict]:
    return [{"prompt_token_ids": [(i * 7 + j * 3) % 250 + 1 for j in range(3 + 5 * i)]} for i in range(6)]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(), PARAMS)]


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_offload_gives_the_same_tokens(request, family):
    model_dir = request.getfixturevalue("tiny_model_dir" if family == "sdar" else "tiny_llada2_dir")
    expected = _tokens(LLM(str(model_dir), num_pages=256))
    for residency in ("block", "step"):
        llm = LLM(str(model_dir), num_pages=256, expert_offload=True, expert_residency=residency)
        assert _tokens(llm) == expected, residency
        stats = llm.engine.stats()
        assert stats.offload.misses > 0 and stats.offload.hits > 0  # a quarter of the experts: both happen
        assert stats.offload.bytes_moved > 0 and stats.expert_bytes_per_generated_token > 0


def _layer(policy: str, cost: OffloadCostModel, num_slots: int = 2):
    """One layer: 4 experts, H 2, I 1 -> one expert = (2 * 1 * 2 + 2 * 1) fp32 = 24 bytes."""
    g = torch.Generator().manual_seed(0)
    gate_up, down = torch.randn(4, 2, 2, generator=g), torch.randn(4, 2, 1, generator=g)
    counters = OffloadCounters()
    cache = ExpertCache(gate_up, down, num_slots, torch.device("cpu"), counters)
    return OffloadedExperts(cache, cost, policy, 4), counters, gate_up, down


def _run(runner: OffloadedExperts, gate_up, down, blocks: tuple[BlockRef, ...], ids: list[int]) -> None:
    """Runs one step of top-1 routing `ids` over `blocks` and checks the rows against the plain grouped dispatch."""
    ids_t = torch.tensor(ids)[:, None]
    x = torch.randn(len(ids), 2, generator=torch.Generator().manual_seed(len(ids)))
    groups = group_by_expert(ids_t, 4)
    sorted_x = x.index_select(0, groups.token_of)
    sorted_out = torch.zeros_like(sorted_x)
    with offload_context(OffloadContext(blocks)):
        runner.run(sorted_x, groups, ids_t, sorted_out)
    weights = torch.ones(len(ids), 1)
    out = torch.zeros_like(x).index_add_(0, groups.token_of, sorted_out)
    assert torch.equal(out, grouped_experts(x, weights, ids_t, gate_up, down))
    runner.cache.check_invariants()


STEPS = [  # (blocks, top-1 expert of each row); block A rows 0-3, block B rows 4-7
    ((BlockRef(("a", 0), 0, 4, True),), [0, 0, 1, 2]),
    ((BlockRef(("a", 0), 0, 4, False),), [0, 1, 2, 2]),
    ((BlockRef(("a", 0), 0, 4, False), BlockRef(("b", 0), 4, 4, True)), [2, 2, 2, 3, 3, 3, 3, 2]),
]


def test_block_residency_accounting_by_hand():
    runner, counters, gate_up, down = _layer("block", ALWAYS_FETCH)
    for blocks, ids in STEPS:
        _run(runner, gate_up, down, blocks, ids)
    # step 1: A wants e0 x2, e1, e2 -> resident {0, 1} (2 loads); e2 misses 1 token, fetched.
    # step 2: residency kept; e0, e1 hit (2 tokens); e2 misses 2 tokens, fetched.
    # step 3: B starts; A's first step (e0 2, e1 1, e2 1) + B's (e2 1, e3 3) -> e3 3, e0 2, e2 2, e1 1
    #         -> {3, 0}: e1 evicted, e3 loaded; e3 hits 4 tokens, e2 misses 4 (fetched).
    assert (counters.hits, counters.misses) == (3 + 2 + 4, 1 + 2 + 4)
    assert (counters.residency_loads, counters.fetches, counters.host_computes) == (3, 3, 0)
    assert counters.bytes_moved == (3 + 3) * 24
    assert counters.hit_rate == 9 / 16


def test_step_residency_accounting_by_hand():
    runner, counters, gate_up, down = _layer("step", ALWAYS_FETCH)
    for blocks, ids in STEPS:
        _run(runner, gate_up, down, blocks, ids)
    # step 1: {0, 1} loaded, e2's token fetched; step 2 wants e2 x2, e0, e1 -> {2, 0} (e1 out, e2 in), e1's token
    # fetched; step 3 wants e2 x4, e3 x4 -> {2, 3} (e0 out, e3 in), all 8 hit. A load per step, for 2 steps.
    assert (counters.hits, counters.misses) == (3 + 3 + 8, 1 + 1)
    assert (counters.residency_loads, counters.fetches) == (4, 2)
    assert counters.bytes_moved == 6 * 24


def test_misses_computed_on_the_host_move_activations_only():
    runner, counters, gate_up, down = _layer("block", ALWAYS_HOST, num_slots=1)
    _run(runner, gate_up, down, *STEPS[0])
    # resident {0}; e1 (1 token) and e2 (1 token) on the host: 2 tokens x H 2 x 4 bytes, there and back.
    assert (counters.hits, counters.misses, counters.host_computes, counters.fetches) == (2, 2, 2, 0)
    assert counters.bytes_moved == 24 + 2 * (2 * 2 * 4)


def test_cost_model_fetches_for_many_tokens_and_computes_few_on_the_host():
    cost = OffloadCostModel(link_bytes_per_s=1e10, host_flops_per_s=5e10)
    expert_bytes, flops, activation = 1_572_864, 786_432, 2048  # sdar-moe-bench: H 512, I 256, fp32
    assert not cost.prefers_fetch(expert_bytes, 4, flops, activation)
    assert cost.prefers_fetch(expert_bytes, 64, flops, activation)


def test_cache_budget_is_split_over_layers_and_too_small_a_budget_is_refused():
    assert num_cache_slots(None, 24, 3, 8) == 2
    assert num_cache_slots(24 * 3 * 5, 24, 3, 8) == 5
    assert num_cache_slots(10**9, 24, 3, 8) == 8
    with pytest.raises(ValueError, match="expert_cache_memory: 50 bytes hold no expert"):
        num_cache_slots(50, 24, 3, 8)
