"""A tiny LLaDA2 directory (Hub layout, sharded) through the normal engine, batched, against the naive recompute
reference with LLaDA2's decoding semantics: block 32 (no block field in the config), threshold 0.95 with a
top-1 fallback (the family's defaults, which the reference restates on its own), stop after the block holding a
stop token, answer cut at the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_model import KNOBS, ReferenceModel, load_reference

PROMPT_LENGTHS = [1, 5, 31, 32, 33, 40, 64, 70]


@pytest.fixture(scope="module")
def llada2_dir(tmp_path_factory) -> Path:
    return write_llada2_checkpoint(
        tmp_path_factory.mktemp("llada2") / "tiny", seed=1, logit_scale=40.0, max_shard_bytes=100_000
    )


@pytest.fixture(scope="module")
def llm(llada2_dir) -> LLM:
    return LLM(str(llada2_dir), num_pages=256, max_num_seqs=8)


@pytest.fixture(scope="module")
def reference(llada2_dir) -> ReferenceModel:
    return load_reference(llada2_dir)


def _prompt(length: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17) % 250 + 1 for i in range(length)]


def _check(
    llm: LLM, reference: ReferenceModel, prompts: list[list[int]], params: list[SamplingParams]
) -> list[list[int]]:
    run = check_parity(llm, reference, prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)
    return run.engine_tokens


def test_llada2_defaults_are_the_reference_decoding(llm, reference):
    engine = llm.engine
    resolved = SamplingParams().with_defaults(engine.generation_defaults)
    assert (engine.args.block_length, resolved.decoder, resolved.threshold, resolved.temperature) == (
        32,
        "threshold",
        0.95,
        0.0,
    )
    assert resolved.steps is None  # the fallback accepts block_length // block_length = 1 token per step
    ours = reference.resolve(SamplingParams())
    assert reference.block_length == 32 and all(getattr(ours, k) == getattr(resolved, k) for k in KNOBS)


def test_engine_matches_the_llada2_reference(llm, reference):
    prompts = [_prompt(n, seed=i) for i, n in enumerate(PROMPT_LENGTHS)]
    params = [SamplingParams(max_tokens=8 + (i * 11) % 36, ignore_eos=True) for i in range(len(prompts))]
    free_running = _check(llm, reference, prompts, params)
    # Stop tokens taken from the middle of each free-running answer: the stop path is the EOS path.
    stopping = [
        p.replace(stop_token_ids=[out[len(out) // 2]], ignore_eos=False) for p, out in zip(params, free_running)
    ]
    stopped = _check(llm, reference, prompts, stopping)
    assert sum(len(a) < len(b) for a, b in zip(stopped, free_running)) >= len(prompts) // 2


def test_an_answer_shorter_than_a_block_caps_the_steps_as_the_reference_does(tmp_path):
    """LLaDA2's `generate` sets steps = min(steps, gen_length): with max_tokens 8 and block 32 each step accepts
    at least 32 // 8 = 4 tokens. A low logit scale keeps every confidence under 0.95, so only that fallback count
    decides, and the engine must take the reference's (fewer) forwards."""
    model_dir = write_llada2_checkpoint(tmp_path / "unsure", seed=2, logit_scale=1.0)
    llm = LLM(str(model_dir), num_pages=64, max_num_seqs=4)
    reference = load_reference(model_dir)
    prompts = [_prompt(n, seed=i) for i, n in enumerate([1, 5, 33])]
    params = [SamplingParams(max_tokens=8, ignore_eos=True)] * len(prompts)
    run = check_parity(llm, reference, prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)
    # every forward accepted >= 4 tokens of the block: at most ceil(masks / 4) forwards per block
    assert all(r.num_forwards <= 8 for r in run.references)
    uncapped = llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert uncapped.num_forwards > 8  # one token a step once the answer is longer than a block


def _raise_mask_logit(model, mask_id: int, by: float) -> None:
    compute_logits = model.compute_logits

    def raised(hidden):
        logits = compute_logits(hidden).clone()
        logits[:, mask_id] += by
        return logits

    model.compute_logits = raised


def test_the_mask_tokens_probability_counts_in_the_confidence_as_in_the_released_file(tmp_path):
    """LLaDA2's released `generate` at temperature 0 ranks positions by softmax(logits)[argmax] over the whole
    vocabulary, the mask token included (issue 28: renormalising without it reordered near-tied positions of
    the fallback). With the mask token's logit raised on both sides it holds a large, position-dependent share
    of the mass, so a confidence renormalised without it ranks and thresholds differently; the reference
    restates the released rule, and never writing the mask token still holds."""
    model_dir = write_llada2_checkpoint(tmp_path / "masky", seed=5, logit_scale=4.0)
    llm = LLM(str(model_dir), num_pages=64, max_num_seqs=4)
    reference = load_reference(model_dir)
    mask_id = llm.engine.args.mask_token_id
    for model in (llm.engine.runner.model, reference.model):
        _raise_mask_logit(model, mask_id, 4.0)
    prompts = [_prompt(n, seed=i) for i, n in enumerate([5, 31, 40])]
    params = [
        SamplingParams(max_tokens=40, threshold=0.5, steps=8, ignore_eos=True),
        SamplingParams(max_tokens=40, threshold=0.2, ignore_eos=True),
        SamplingParams(max_tokens=20, threshold=0.3, ignore_eos=True),
    ]
    run = check_parity(llm, reference, prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)
    assert all(mask_id not in tokens for tokens in run.engine_tokens)
