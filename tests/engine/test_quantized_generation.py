"""The engine with quantized weights (`LLM(..., quantization=...)`) decodes exactly like the naive references
driving the same quantized model, at temperature 0, token for token: the attention families through the
recompute reference, Clover through its block-diffusion reference decoder."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode
from diffuserve.reference.reference_model import load_reference
from tests.conftest import tiny_checkpoint

OPTIONS = {"quantization_group_size": 32}


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("q"), "sdar", shared_expert_intermediate_size=64)


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_quantized_engine_matches_the_reference_on_the_same_weights(sdar_dir, method):
    llm = LLM(str(sdar_dir), num_pages=256, max_num_seqs=8, quantization=method, **OPTIONS)
    _, model = load_model(sdar_dir, quantization=make_scheme(method, group_size=32))
    prompts = [[(i * 37 + j * 11) % 250 + 1 for j in range(3 + 5 * i)] for i in range(6)]
    params = [SamplingParams(threshold=0.7, max_tokens=6 + 5 * i, ignore_eos=True) for i in range(6)]
    run = check_parity(llm, load_reference(sdar_dir, model=model), prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)


def test_quantized_clover_block_diffusion_matches_the_reference_decoder(tmp_path):
    config = make_clover_moe_config(block_length=4, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    model_dir = write_clover_moe_checkpoint(tmp_path / "bd", config, seed=12, init_std=0.1, logit_scale=20.0)
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, decoder="threshold", threshold=0.5)
    prompts = [[5, 9, 14, 2, 7, 30, 11], [3, 1, 4, 1, 5, 9, 2, 6, 5]]
    llm = LLM(str(model_dir), device="cpu", max_model_len=256, quantization="int4", **OPTIONS)
    got = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]
    _, model = load_model(model_dir, quantization=make_scheme("int4", group_size=32))
    expected = [
        reference_block_decode(DenseClover(model), p, ReferenceSettings(max_new_tokens=9, threshold=0.5))
        for p in prompts
    ]
    assert got == expected
