"""LLaDA2.1 token editing (decoder="edit"): the decoder on hand-set proposals, when a block becomes final, and the
engine (paged cache, fused commit, batching) against the naive recompute reference on a tiny LLaDA2 model whose
blocks really get edited, with the committed K/V checked against a single no-cache pass over the final tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.core.request import Request, RequestStatus
from diffuserve.decoding.mask_policies import MASK_POLICIES, Proposal
from diffuserve.model.layers.attention import PagedAttentionInputs, SequenceSlice, block_causal_mask
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import ReferenceModel, load_reference
from diffuserve.worker.cache.paged_step import PagedMetadataBuilder

MASK, NEG = 99, float("-inf")
EDIT = SamplingParams(decoder="edit", threshold=0.7, edit_threshold=0.5, max_post_edit_steps=4)


def _decide(canvas: list[int], tokens: list[int], conf: list[float], params: SamplingParams) -> list[int]:
    canvas_t = torch.tensor(canvas)
    proposal = Proposal(torch.tensor(tokens), torch.tensor(conf), None)
    write = MASK_POLICIES["edit"].decide(proposal, canvas_t, canvas_t == MASK, 0, params.with_defaults({}), len(canvas))
    return write.nonzero().flatten().tolist()


def test_edit_decoder_fills_masks_and_rewrites_confident_changes():
    # position 0 is the prompt's tail (no proposal); 1 and 3 are accepted; 2 and 4 are masked
    canvas = [7, 11, MASK, 13, MASK]
    assert MASK_POLICIES["edit"].logit_positions([2, 4], 1, 5) == [1, 2, 3, 4]
    assert MASK_POLICIES["threshold"].logit_positions([2, 4], 1, 5) == [2, 4]
    tokens = [0, 12, 20, 13, 21]
    assert _decide(canvas, tokens, [NEG, 0.6, 0.8, 0.9, 0.3], EDIT) == [1, 2]  # 3 proposes its own token
    assert _decide(canvas, tokens, [NEG, 0.5, 0.6, 0.9, 0.3], EDIT) == [2]  # strict >; top-1 mask fallback
    assert _decide([MASK, 11, 12], [5, 12, 12], [0.99, 0.99, 0.99], EDIT) == [0, 1]  # first_generated 0: no prompt
    assert _decide(canvas, [0, 12, 20, 14, 21], [NEG, 0.4, 0.95, 0.51, 0.99], EDIT) == [2, 3, 4]


def _request(params: SamplingParams, block: int = 4) -> Request:
    resolved = params.replace(max_tokens=12, stop_token_ids=[50]).with_defaults({})
    return Request("r", [1, 2], resolved, block, MASK)


def test_an_editing_block_is_final_after_a_quiet_step_or_the_budget():
    request = _request(EDIT.replace(max_post_edit_steps=2))  # canvas [1, 2, MASK, MASK]
    request.apply_step([(2, 50), (3, 6)])  # masks filled, EOS proposed at 2: not final, not a stop yet
    assert not request.block_is_final and request.stop_check() is None
    request.apply_step([(2, 5)])  # post-edit step 1 edits the EOS away
    assert not request.block_is_final
    request.apply_step([(3, 8)])  # post-edit step 2 still edits: the budget is spent
    assert request.block_is_final and request.stop_check() is None
    assert request.finish_block() == [5, 8]
    request.apply_step([(0, 9), (1, 50), (2, 3), (3, 4)])
    request.apply_step([])  # a quiet step: final at once
    stop = request.stop_check()
    assert request.block_is_final and stop is not None
    assert (stop.status, stop.token_ids, stop.stop_reason) == (RequestStatus.FINISHED_STOPPED, [5, 8, 9, 50], 50)


def test_without_editing_a_block_is_final_when_its_masks_are_gone():
    request = _request(SamplingParams(decoder="threshold"))
    request.apply_step([(2, 50)])
    assert not request.block_is_final
    stop = request.stop_check()
    assert stop is not None and stop.token_ids == [50]  # early exit, as before


@pytest.fixture(scope="module")
def llada21_dir(tmp_path_factory) -> Path:
    return write_llada2_checkpoint(tmp_path_factory.mktemp("llada21") / "tiny", seed=2, logit_scale=40.0)


@pytest.fixture(scope="module")
def llm(llada21_dir) -> LLM:
    return LLM(str(llada21_dir), num_pages=256, max_num_seqs=8, block_length=8)


@pytest.fixture(scope="module")
def reference(llada21_dir) -> ReferenceModel:
    return load_reference(llada21_dir, block_length=8)


def test_editing_engine_matches_the_recompute_reference(llm, reference):
    prompts = [[(i * 37 + j * 11) % 250 + 1 for j in range(n)] for i, n in enumerate([1, 6, 8, 13, 21])]
    params = [EDIT.replace(max_tokens=10 + 3 * i, ignore_eos=True) for i in range(len(prompts))]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    edits = 0
    for prompt, p, out in zip(prompts, params, outputs):
        expected = reference_generate(reference, prompt, p)
        assert out.outputs[0].token_ids == expected.token_ids
        assert out.num_forwards == expected.num_forwards == expected.forwards_to_answer  # post-edit steps, fused
        edits += expected.num_edits
        stop = p.replace(stop_token_ids=[expected.token_ids[len(expected.token_ids) // 2]], ignore_eos=False)
        assert (
            llm.generate({"prompt_token_ids": prompt}, stop)[0].outputs[0].token_ids
            == reference_generate(reference, prompt, stop).token_ids
        )
    assert edits > 0


def test_committed_kv_are_those_of_the_final_edited_tokens(llm, reference):
    engine, block = llm.engine, llm.engine.args.block_length
    engine.add_request("kv", [5, 9, 14], EDIT.replace(max_tokens=40, ignore_eos=True))
    request = engine.scheduler.requests["kv"]
    edited_blocks = set()
    while request.num_computed_tokens < 4 * block:
        assert not request.status.is_finished
        before, start = list(request.canvas), request.block_start
        engine.step()
        if request.block_start == start:
            edited_blocks |= {start for a, b in zip(before, request.canvas) if MASK not in (a, b) and a != b}
    assert edited_blocks & set(range(0, request.num_computed_tokens, block))  # an edited block was committed
    length = request.num_computed_tokens
    expected_k, expected_v = _single_pass_kv(engine, request.known_tokens(0, length))
    builder = PagedMetadataBuilder("kv", engine.cache.page_size, block, engine.runner.rules, torch.device("cpu"))
    slots = builder.key_slots(request.page_ids, length)
    for layer, (k, v) in enumerate(zip(expected_k, expected_v)):
        assert torch.allclose(engine.runner.executor.caches.paged["kv"].k_caches[layer][slots], k, atol=1e-5)
        assert torch.allclose(engine.runner.executor.caches.paged["kv"].v_caches[layer][slots], v, atol=1e-5)
    while engine.has_unfinished_requests():
        engine.step()
    prompt, params = [5, 9, 14], EDIT.replace(max_tokens=40, ignore_eos=True)
    assert request.output_token_ids == reference_generate(reference, prompt, params).token_ids


def _single_pass_kv(engine, tokens: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """K/V of `tokens` from one block-causal forward into fresh caches: what a no-cache reference computes."""
    length = len(tokens)
    k_caches = [torch.zeros_like(c) for c in engine.runner.executor.caches.paged["kv"].k_caches]
    v_caches = [torch.zeros_like(c) for c in engine.runner.executor.caches.paged["kv"].v_caches]
    positions = torch.arange(length)
    mask = block_causal_mask(positions, length, engine.args.block_length)
    inputs = PagedAttentionInputs(positions, (SequenceSlice.of(0, length, positions, mask),), k_caches, v_caches)
    with torch.inference_mode():
        engine.runner.model(torch.tensor(tokens), positions, StepInputs(inputs))
    return [k[:length] for k in k_caches], [v[:length] for v in v_caches]


def test_sampled_editing_is_the_same_batched_and_one_at_a_time(llm):
    prompts = [[(i * 7 + j * 3) % 250 + 1 for j in range(3 + 5 * i)] for i in range(4)]
    params = [EDIT.replace(max_tokens=12, temperature=0.8, seed=10 + i, ignore_eos=True) for i in range(4)]
    batched = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    alone = [llm.generate({"prompt_token_ids": p}, q)[0].outputs[0].token_ids for p, q in zip(prompts, params)]
    assert batched == alone
