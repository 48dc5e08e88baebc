"""clover_moe config.json reading: defaults of the base class (the real 35B-A3B shape), the layer pattern, the
text_config layout, mRoPE read as 1-D RoPE for text, and the per-sequence state sizes docs/models/clover.md quotes."""

from __future__ import annotations

from diffuserve.model.families.clover_moe.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    cache_layout,
    clover_moe_args_from_hf,
    hybrid_args,
)

REAL_SHAPE = dict(
    architectures=["CloverMoeModelLM"],
    model_type="clover_moe",
    vocab_size=248320,
    hidden_size=2048,
    num_hidden_layers=40,
    num_attention_heads=16,
    mask_token_id=248319,
)


def test_defaults_are_the_35b_a3b_shape():
    args = clover_moe_args_from_hf(REAL_SHAPE)
    hybrid = hybrid_args(args)
    assert hybrid.layer_types.count(LINEAR_ATTENTION) == 30 and hybrid.layer_types.count(FULL_ATTENTION) == 10
    assert [i for i, t in enumerate(hybrid.layer_types) if t == FULL_ATTENTION] == list(range(3, 40, 4))
    assert (args.num_kv_heads, args.head_dim, args.rope.partial_rotary_factor) == (2, 256, 0.25)
    assert (args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size) == (256, 8, 512)
    assert args.shared_expert_intermediate_size == 512 and args.block_length == 32
    gdn = hybrid.gdn
    assert (gdn.num_key_heads, gdn.num_value_heads, gdn.conv_dim, gdn.conv_kernel) == (16, 32, 8192, 4)
    assert hybrid.prediction_shift and not hybrid.has_diffusion


def test_state_sizes_of_the_real_model():
    """docs/models/clover.md: 20 KiB of K/V per token (10 layers x 2 x 2 heads x 256 x 2 B); per sequence 30 x (2 MiB
    S + 8192 x 3 x 2 B conv ring) = 60 MiB + 1,474,560 B."""
    layout = cache_layout(clover_moe_args_from_hf(REAL_SHAPE), "bf16")
    assert layout.kv_bytes_per_token() == 20 * 1024
    assert layout.state_bytes_per_sequence() == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2) == 60 * 2**20 + 1_474_560


def test_text_config_and_mrope():
    rope = {
        "rope_type": "mrope",
        "rope_theta": 1e7,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
        "partial_rotary_factor": 0.25,
    }
    text = {
        **{k: v for k, v in REAL_SHAPE.items() if k != "architectures"},
        "rope_parameters": rope,
        "full_attention_interval": 2,
    }
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text}
    args = clover_moe_args_from_hf(config)
    assert args.rope.rope_type == "default" and args.rope.theta == 1e7
    assert hybrid_args(args).layer_types[:2] == (LINEAR_ATTENTION, FULL_ATTENTION)
    assert args.architecture == "Qwen3_5MoeForConditionalGeneration"


def test_prediction_shift_switch():
    args = clover_moe_args_from_hf({**REAL_SHAPE, "diffusion_prediction_shift": False})
    assert not hybrid_args(args).prediction_shift
