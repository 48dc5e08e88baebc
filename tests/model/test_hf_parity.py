"""Logits parity with transformers' Qwen3 / Qwen3-MoE (same random weights, fp32, explicit block-causal mask),
and loading of directories written by their `save_pretrained`."""

from __future__ import annotations

import json

import pytest
import torch

from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.loader import load_model
from diffuserve.model.step_inputs import StepInputs

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BLOCK = 4
SHAPE = dict(
    vocab_size=96,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def _hf_model(kind: str, **extra):
    torch.manual_seed(0)
    if kind == "moe":
        config = transformers.Qwen3MoeConfig(
            **SHAPE,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            **extra,
        )
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPE, **extra))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.1)  # HF zero-inits the router; random values make routing non-trivial
    return model.eval()


def _save(model, path, architecture: str):
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=[architecture], mask_token_id=95, block_length=BLOCK)
    (path / "config.json").write_text(json.dumps(config))


def _compare(hf_model, ours, length: int = 22) -> float:
    ids = torch.randint(0, SHAPE["vocab_size"], (2, length), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length)
    mask = block_causal_mask(positions, length, BLOCK)  # [T, T]
    additive = torch.zeros(length, length).masked_fill(~mask, float("-inf"))[None, None].expand(2, 1, -1, -1)
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=additive, position_ids=positions[None].expand(2, -1)).logits
        hidden = ours(ids, positions[None].expand(2, -1), StepInputs(DenseAttentionInputs(mask[None, None])))
        got = ours.compute_logits(hidden)
    return (got - expected).abs().max().item()


@pytest.mark.parametrize("kind, architecture", [("dense", "SDARForCausalLM"), ("moe", "SDARMoeForCausalLM")])
def test_logits_match_transformers(tmp_path, kind, architecture):
    hf_model = _hf_model(kind)
    _save(hf_model, tmp_path, architecture)
    args, ours = load_model(tmp_path, dtype="float32")
    assert args.block_length == BLOCK
    if kind == "moe":
        assert args.dense_layer_ids == frozenset({1})
    assert _compare(hf_model, ours) <= 1e-4


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_scaling_matches_transformers(tmp_path, scaling):
    hf_model = _hf_model("dense", rope_parameters={"rope_theta": 10000.0, **scaling})
    _save(hf_model, tmp_path, "SDARForCausalLM")
    _, ours = load_model(tmp_path, dtype="float32")
    assert _compare(hf_model, ours, length=40) <= 1e-4
