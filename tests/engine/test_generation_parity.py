"""The engine (paged KV cache, fused commit, batching) against the naive recompute reference, at temperature 0:
token for token and forward for forward, for block lengths 4 and 32, prompt lengths on and off the block grid,
and every decoder. The reference shares only the model's forward with the engine (diffuserve/reference)."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_model import load_reference

PROMPT_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 31, 32, 33, 40, 47, 63, 64, 65, 70]
DECODER_PARAMS = {
    "threshold": SamplingParams(decoder="threshold", threshold=0.7),
    "threshold-steps": SamplingParams(decoder="threshold", threshold=0.95, steps=2),
    "fixed": SamplingParams(decoder="fixed", steps=2),
    "entropy": SamplingParams(decoder="entropy", entropy_bound=0.5),
}


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17) % 250 + 1 for i in range(length)]


def parity_cases(base: SamplingParams, lengths: list[int] = PROMPT_LENGTHS):
    prompts = [prompt_of(n, seed=i) for i, n in enumerate(lengths)]
    return prompts, [base.replace(max_tokens=5 + (i * 7) % 40, ignore_eos=True) for i in range(len(prompts))]


@pytest.mark.parametrize("decoder", list(DECODER_PARAMS))
@pytest.mark.parametrize("block", [4, 32])
def test_engine_matches_recompute_reference(request, block, decoder):
    model_dir = request.getfixturevalue("tiny_model_dir" if block == 4 else "tiny_model_dir_b32")
    llm, reference = LLM(str(model_dir), num_pages=512, max_num_seqs=8), load_reference(model_dir)
    prompts, params = parity_cases(DECODER_PARAMS[decoder])
    free_running = check_parity(llm, reference, prompts, params)
    assert not free_running.mismatches, "\n".join(free_running.mismatches)
    # Stop ids taken from the middle of each free-running answer, so that stops really happen.
    stopping = [
        p.replace(stop_token_ids=[out[len(out) // 2]], ignore_eos=False)
        for p, out in zip(params, free_running.engine_tokens)
    ]
    stopped = check_parity(llm, reference, prompts, stopping)
    assert not stopped.mismatches, "\n".join(stopped.mismatches)
    assert sum(len(a) < len(b) for a, b in zip(stopped.engine_tokens, free_running.engine_tokens)) >= len(prompts) // 2


@pytest.mark.parametrize("block", [4, 32])
def test_threshold_is_strict(saturated_model_dirs, block):
    """threshold 1.0 on a head whose confidences are mostly exactly 1.0: strict > accepts none of them, so every
    step falls back to the single most confident position (`>=` would accept them all at once)."""
    model_dir = saturated_model_dirs[block]
    llm, reference = LLM(str(model_dir), num_pages=512, max_num_seqs=8), load_reference(model_dir)
    prompts, params = parity_cases(SamplingParams(decoder="threshold", threshold=1.0), PROMPT_LENGTHS[::3])
    run = check_parity(llm, reference, prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)
    assert all(r.forwards_to_answer >= len(r.token_ids) for r in run.references)  # one token a step


SAMPLED_PARAMS = {
    "temperature": SamplingParams(temperature=0.8),
    "top-k-top-p-entropy": SamplingParams(temperature=1.0, top_k=20, top_p=0.9, decoder="entropy"),
    "top-p-threshold": SamplingParams(temperature=0.7, top_p=0.5, threshold=0.5),
}


@pytest.mark.parametrize("sampling", list(SAMPLED_PARAMS))
@pytest.mark.parametrize("block", [4, 32])
def test_seeded_sampling_matches_the_reference(request, block, sampling):
    """Seeded requests draw the same tokens as the reference's own sampler (temperature, top-k, top-p) fed by a
    generator with the same seed: the engine batches them without changing any request's draws."""
    model_dir = request.getfixturevalue("tiny_model_dir" if block == 4 else "tiny_model_dir_b32")
    llm, reference = LLM(str(model_dir), num_pages=512, max_num_seqs=8), load_reference(model_dir)
    prompts, params = parity_cases(SAMPLED_PARAMS[sampling])
    run = check_parity(llm, reference, prompts, [p.replace(seed=100 + i) for i, p in enumerate(params)])
    assert not run.mismatches, "\n".join(run.mismatches)


def test_min_tokens_suppresses_stops_like_the_reference(tiny_model_dir):
    llm, reference = LLM(str(tiny_model_dir), num_pages=256), load_reference(tiny_model_dir)
    for n in (3, 6, 11):
        prompt = prompt_of(n, seed=n)
        free = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=30, ignore_eos=True))[0]
        stop_ids = sorted(set(free.outputs[0].token_ids[:4]))  # tokens the model wants to emit early
        params = SamplingParams(max_tokens=30, min_tokens=9, stop_token_ids=stop_ids, threshold=0.6)
        run = check_parity(llm, reference, [prompt], [params])
        assert not run.mismatches, run.mismatches
        assert not set(run.engine_tokens[0][:9]) & set(stop_ids)


def test_default_decoding_matches_the_reference_defaults(tiny_model_dir):
    """No knob set: the engine's defaults (threshold 0.9, one token a step in the fallback, max_tokens 16) and EOS
    stops are the documented ones the reference restates on its own; max_tokens=None fills max_model_len."""
    prompts = [prompt_of(n, seed=n) for n in (2, 9, 30)]
    llm, reference = LLM(str(tiny_model_dir), num_pages=256), load_reference(tiny_model_dir)
    run = check_parity(llm, reference, prompts, [SamplingParams()] * len(prompts))
    assert not run.mismatches, run.mismatches
    capped = LLM(str(tiny_model_dir), num_pages=256, max_model_len=48)
    run = check_parity(
        capped,
        load_reference(tiny_model_dir, max_model_len=48),
        prompts,
        [SamplingParams(max_tokens=None, ignore_eos=True)] * len(prompts),
    )
    assert not run.mismatches, run.mismatches
    assert [len(t) for t in run.engine_tokens] == [48 - len(p) for p in prompts]
