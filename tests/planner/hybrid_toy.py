"""A toy hybrid (Gated DeltaNet + gated attention) MoE config with round numbers for hand arithmetic.

hidden 512, 4 layers with full_attention_interval 4 (layers 0-2 GDN, layer 3 full attention); attention 4 query /
1 KV heads of 128 with an output gate; GDN 2 key heads x 64, 4 value heads x 64, conv kernel 4 (conv_dim
2 x 128 + 256 = 512); 8 experts top-2 of width 128 and a gated shared expert of 128; vocab 1000, untied.
"""

from __future__ import annotations

from diffuserve.planner.model_spec import ModelSpec, spec_from_config

HYBRID_TOY_CONFIG = dict(
    architectures=["CloverMoeModelLM"],
    model_type="clover_moe",
    hidden_size=512,
    num_hidden_layers=4,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=128,
    linear_num_key_heads=2,
    linear_key_head_dim=64,
    linear_num_value_heads=4,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    vocab_size=1000,
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    block_length=16,
)


def hybrid_toy_spec(**overrides: object) -> ModelSpec:
    return spec_from_config({**HYBRID_TOY_CONFIG, **overrides}, "hybrid-toy")
