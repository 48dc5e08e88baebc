"""The engine (paged KV cache, fused commit, batching) against the naive recompute reference, at temperature 0:
token for token, for block lengths 4 and 32, prompt lengths on and off the block grid, and every decoder."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.bench.reference_decode import reference_generate

PROMPT_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 31, 32, 33, 40, 47, 63, 64, 65, 70]
DECODER_PARAMS = {
    "threshold": SamplingParams(decoder="threshold", threshold=0.7),
    "threshold-steps": SamplingParams(decoder="threshold", threshold=0.95, steps=2),
    "fixed": SamplingParams(decoder="fixed", steps=2),
    "entropy": SamplingParams(decoder="entropy", entropy_bound=0.5),
}


def _prompt(length: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17) % 250 + 1 for i in range(length)]


def _reference(llm: LLM, prompt: list[int], params: SamplingParams):
    engine = llm.engine
    resolved = engine.resolve_params(params, len(prompt))
    return reference_generate(engine.runner.model, engine.args, prompt, resolved, resolved.max_tokens,
                              resolved.stop_ids)


@pytest.mark.parametrize("decoder", list(DECODER_PARAMS))
@pytest.mark.parametrize("block", [4, 32])
def test_engine_matches_recompute_reference(request, block, decoder):
    model_dir = request.getfixturevalue("tiny_model_dir" if block == 4 else "tiny_model_dir_b32")
    llm = LLM(str(model_dir), num_pages=512, max_num_seqs=8)
    base = DECODER_PARAMS[decoder]
    prompts = [_prompt(n, seed=i) for i, n in enumerate(PROMPT_LENGTHS)]
    params = [base.replace(max_tokens=5 + (i * 7) % 40, ignore_eos=True) for i in range(len(prompts))]
    free_running = _check_against_reference(llm, prompts, params)
    # Stop ids taken from the middle of each free-running answer, so that stops really happen.
    stopping = [
        p.replace(stop_token_ids=[out[len(out) // 2]], ignore_eos=False) for p, out in zip(params, free_running)
    ]
    stopped = _check_against_reference(llm, prompts, stopping)
    assert sum(len(a) < len(b) for a, b in zip(stopped, free_running)) >= len(prompts) // 2


def _check_against_reference(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, p, out in zip(prompts, params, outputs):
        expected = _reference(llm, prompt, p)
        assert out.outputs[0].token_ids == expected.token_ids, f"prompt length {len(prompt)}"
        assert out.num_forwards <= expected.num_forwards  # early exit may only save forwards
    return [out.outputs[0].token_ids for out in outputs]


def test_min_tokens_suppresses_stops_like_the_reference(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256)
    for n in (3, 6, 11):
        prompt = _prompt(n, seed=n)
        free = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=30, ignore_eos=True))[0]
        stop_ids = sorted(set(free.outputs[0].token_ids[:4]))  # tokens the model wants to emit early
        params = SamplingParams(max_tokens=30, min_tokens=9, stop_token_ids=stop_ids, threshold=0.6)
        out = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0]
        assert out.token_ids == _reference(llm, prompt, params).token_ids
        assert not set(out.token_ids[:9]) & set(stop_ids)
