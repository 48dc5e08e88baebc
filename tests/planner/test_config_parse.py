"""The planner and the engine read a config.json's block length and dense layers through one parser
(diffuserve/model/config.py), so a plan is always about the model the engine would load.

The bug this pins down: the planner accepted `bd_size` and `canvas_length` for every family while the model
read `bd_size` only for the sdar (then "clover") family and `canvas_length` for none, so an LLaDA2 config with
`bd_size: 4` was planned with blocks of 4 and served with blocks of 32.
"""

from __future__ import annotations

import pytest

from diffuserve.model.config import BLOCK_LENGTH_KEYS, qwen3_args_from_hf
from diffuserve.model.families.llada2.config import llada2_args_from_hf
from diffuserve.planner.model_spec import spec_from_config

SDAR = {
    "architectures": ["SDARMoeForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 128,
    "vocab_size": 300,
    "mask_token_id": 299,
}
LLADA2 = {**SDAR, "architectures": ["LLaDA2MoeModelLM"], "first_k_dense_replace": 1}


def _block_lengths(config: dict) -> tuple[int, int]:
    parse = llada2_args_from_hf if config["architectures"] == ["LLaDA2MoeModelLM"] else qwen3_args_from_hf
    return spec_from_config(config).block_length, parse(config).block_length


@pytest.mark.parametrize("base", [SDAR, LLADA2], ids=["sdar", "llada2"])
@pytest.mark.parametrize("key", BLOCK_LENGTH_KEYS)
def test_every_block_length_spelling_reads_the_same_in_planner_and_model(base, key):
    assert _block_lengths({**base, key: 4}) == (4, 4)


@pytest.mark.parametrize("base", [SDAR, LLADA2], ids=["sdar", "llada2"])
def test_no_block_field_means_32_and_the_first_spelling_wins(base):
    assert _block_lengths(base) == (32, 32)
    assert _block_lengths({**base, "block_length": 8, "bd_size": 4}) == (8, 8)


def test_a_bad_block_length_names_the_field():
    with pytest.raises(ValueError, match="`bd_size` is 0"):
        spec_from_config({**SDAR, "bd_size": 0})


@pytest.mark.parametrize(
    "dense_keys", [{"first_k_dense_replace": 1}, {"mlp_only_layers": [0, 3]}, {"decoder_sparse_step": 2}]
)
def test_dense_layers_agree(dense_keys):
    config = {**SDAR, **dense_keys}
    args = qwen3_args_from_hf(config)
    moe_layers = sum(args.is_moe_layer(i) for i in range(args.num_layers))
    assert spec_from_config(config).num_moe_layers == moe_layers
