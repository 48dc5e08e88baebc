"""The SDAR-scheme transformers variant of `bench compare`: the same tokens as the full-recompute reference, one
commit forward per finished block (the prompt's included), and a fresh cache for a new request."""

from __future__ import annotations

import pytest
import torch

from diffuserve.bench.compare import _dense_mask
from diffuserve.bench.hf_reference import SdarCachedTransformers, load_transformers_model
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference
from diffuserve.sampling_params import SamplingParams

pytest.importorskip("transformers")


def test_cached_sdar_scheme_matches_full_recompute(bench_model_dir):
    recompute = load_reference(bench_model_dir, model=load_transformers_model(bench_model_dir, "float32"))
    cached_model = load_transformers_model(bench_model_dir, "float32", sdar_cache_block=4)
    assert isinstance(cached_model, SdarCachedTransformers)
    cached = load_reference(bench_model_dir, model=cached_model)
    params = SamplingParams(max_tokens=14, ignore_eos=True, temperature=0.0)
    for prompt in ([5, 9, 13, 2, 7, 11], [3, 4, 5, 6, 7, 8, 9, 10]):  # off and on the block grid
        commits_before = cached_model.commit_forwards
        expected = reference_generate(recompute, prompt, params)
        got = reference_generate(cached, prompt, params)
        assert got.token_ids == expected.token_ids and got.num_forwards == expected.num_forwards
        blocks = len(got.steps_per_block)  # each block's prefix (prompt, then finished blocks) committed once
        assert cached_model.commit_forwards - commits_before == blocks
        assert cached_model.cache.get_seq_length() == (len(prompt) // 4 + blocks - 1) * 4


def test_rows_before_the_current_block_are_not_computed(bench_model_dir):
    model = load_transformers_model(bench_model_dir, "float32", sdar_cache_block=4)
    with torch.inference_mode():
        hidden = model(torch.arange(1, 9)[None], torch.arange(8)[None], _dense_mask(8, 4))
    assert hidden[0, :4].isnan().all() and not hidden[0, 4:].isnan().any()
