"""Autoregressive decoding of a model that predicts position p from row p - 1 (Clover at block length 1): the
one-token block is never a query row of the forward (`ScheduledRequest.forwards_block`), its logits come from the
last committed row. Checked against transformers' Qwen3_5MoeForCausalLM, recomputing the whole sequence for every
token (no cache, no engine code), under the engine options that change how a step is laid out: no fused commit
(a block step with no commit rows, so no forward at all), a short token budget, preemption, prefix caching.
The forward's rows are counted: each prompt and output token once, no block row."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from tests.engine.clover_greedy import greedy_by_recompute

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

PREFIX = [5, 9, 11, 40, 41, 42, 7, 8, 100, 101, 102, 103, 13, 14, 15, 16, 17]
PROMPTS = [PREFIX + [60 + i] * (i % 5) + [i] for i in range(6)]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    config = make_clover_moe_config(block_length=4)
    return write_clover_moe_checkpoint(tmp_path_factory.mktemp("headless"), config, seed=3, init_std=0.1)


@pytest.fixture(scope="module")
def expected(model_dir) -> list[list[int]]:
    return greedy_by_recompute(model_dir, PROMPTS, [MAX_TOKENS] * len(PROMPTS))


def _run(model_dir, **options) -> tuple[list[list[int]], int, LLM]:
    """The engine's tokens at block length 1 and the number of rows its forwards computed."""
    llm = LLM(str(model_dir), device="cpu", block_length=1, max_model_len=64, **options)
    executor = llm.engine.runner.executor
    forward, rows = executor.forward, []

    def counting(inputs):
        rows.append(inputs.input_ids.numel())
        return forward(inputs)

    executor.forward = counting
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]
    return tokens, sum(rows), llm


def test_blocks_are_read_from_the_last_committed_row(model_dir, expected):
    tokens, rows, llm = _run(model_dir, enable_prefix_caching=False)
    assert tokens == expected
    # every prompt token and every output token but the last is committed once; no block row is computed
    assert rows == sum(len(p) + MAX_TOKENS - 1 for p in PROMPTS)
    assert llm.engine.scheduler.forward_blocks is False


@pytest.mark.parametrize(
    "options",
    [
        dict(fused_commit=False),  # a block's step has no commit rows: no forward, the kept row alone
        dict(max_num_batched_tokens=8, max_num_seqs=3),  # chunked prefill, commits without the block
        dict(enable_prefix_caching=True),  # the shared prefix's pages and state snapshot reused
    ],
    ids=["no fused commit", "short budget", "prefix caching"],
)
def test_headless_blocks_under_engine_options(model_dir, expected, options):
    tokens, _, _ = _run(model_dir, **options)
    assert tokens == expected


def test_headless_blocks_under_preemption(model_dir, expected):
    probe = LLM(str(model_dir), device="cpu", block_length=1, max_model_len=64)
    slot = probe.engine.state_pool.slot_bytes
    # 16-token pages: 5 for requests that grow from 2 pages to 3 (prompts of 18 to 22 tokens, 16 more)
    tokens, _, llm = _run(model_dir, num_pages=5, state_cache_memory=3 * slot, enable_prefix_caching=False)
    assert tokens == expected and llm.engine.stats().num_preemptions > 0
