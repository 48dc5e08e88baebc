"""clover_moe through the engine's simple (recompute) path: a checkpoint without the block-diffusion tensors
generates, at temperature 0, exactly transformers' greedy tokens, one prompt or several; a checkpoint with them
decodes blocks exactly like the naive reference decoder."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.baselines.engines import baseline_llm
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode

PROMPTS = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100, 33, 10], [1, 2, 3]]


@pytest.fixture(scope="module")
def ar_dir(tmp_path_factory):
    config = make_clover_moe_config(block_length=4, num_hidden_layers=4)
    return write_clover_moe_checkpoint(
        tmp_path_factory.mktemp("engine") / "ar", config, seed=11, init_std=0.1, logit_scale=10.0, diffusion=False
    )


def _llm(model_dir):
    return LLM(str(model_dir), device="cpu", max_model_len=256)


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.hf
def test_generate_equals_transformers_greedy(ar_dir):
    pytest.importorskip("transformers")
    from tests.model.test_clover_moe_parity import _hf_model

    hf = _hf_model(ar_dir)
    llm = _llm(ar_dir)
    single = llm.generate(PROMPTS[0], _greedy(11))[0].outputs[0].token_ids
    batched = [out.outputs[0].token_ids for out in llm.generate(PROMPTS, _greedy(11))]
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=0)[
                0, len(p) :
            ].tolist()
            for p in PROMPTS
        ]
        same_length = hf.generate(
            torch.tensor(PROMPTS[:2]), max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=0
        )[:, 7:].tolist()
    assert list(single) == expected[0]
    assert [list(t) for t in batched] == expected
    assert same_length == expected[:2]


def test_block_diffusion_matches_the_reference_decoder(tmp_path):
    from diffuserve.model.loader import load_model

    config = make_clover_moe_config(block_length=4)
    model_dir = write_clover_moe_checkpoint(tmp_path / "bd", config, seed=12, init_std=0.1, logit_scale=20.0)
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, decoder="threshold", threshold=0.5)
    got = [list(out.outputs[0].token_ids) for out in _llm(model_dir).generate(PROMPTS, params)]
    _, model = load_model(model_dir)
    expected = [
        reference_block_decode(DenseClover(model), p, ReferenceSettings(max_new_tokens=9, threshold=0.5))
        for p in PROMPTS
    ]
    assert got == expected


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(expert_offload=True, baseline="recompute"), "expert_offload"),
        (dict(expert_offload=True, baseline="rescan"), "expert_offload"),
    ],
)
def test_hybrid_models_refuse_what_they_cannot_do(ar_dir, kwargs, field):
    """Expert offload outside the state pool (the bench baselines). Tensor parallelism is served:
    tests/distributed/test_clover_parallel.py."""
    baseline = kwargs.pop("baseline", None)
    with pytest.raises(ValueError, match=f"^{field}: .*recurrent layers"):
        if baseline is None:
            LLM(str(ar_dir), device="cpu", max_model_len=256, **kwargs)
        else:
            baseline_llm(str(ar_dir), baseline, device="cpu", max_model_len=256, **kwargs)
