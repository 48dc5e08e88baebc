"""A toy MoE config with round numbers, so the tests' hand arithmetic stays short.

hidden 1024, 4 layers, 8 query / 2 KV heads of 128, 8 experts top-2 of width 512, vocab 1000, untied, block 16.
"""

from __future__ import annotations

from diffuserve.planner.model_spec import ModelSpec, spec_from_config

TOY_CONFIG = dict(
    architectures=["SDARMoeForCausalLM"],
    hidden_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=4096,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
    vocab_size=1000,
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    block_length=16,
)


def toy_spec(**overrides: object) -> ModelSpec:
    return spec_from_config({**TOY_CONFIG, **overrides}, "toy")
