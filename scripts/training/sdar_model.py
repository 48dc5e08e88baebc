"""The old bundled model's shape and initialisation: a tiny SDAR-MoE-shaped (Qwen3-MoE trunk, block-causal
attention in every layer) model, trained by `scripts/train_tiny_model.py --family sdar`.

Owns its model shape, config.json and seeded initialisation. Knows nothing of batches or of the loop.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.registry import family_for

from .diffusion_batch import END_OF_TEXT, MASK

SDAR_SHAPE: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    intermediate_size=256,
    vocab_size=272,
    block_length=4,
    max_position_embeddings=1024,
)
"""The default model before the tiny Clover: a byte-level vocabulary (256 bytes, 4 specials, filler to 272)."""


def sdar_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The config.json of an SDAR-MoE-shaped model with this shape and the byte tokenizer's special ids."""
    return dict(
        architectures=["SDARMoeForCausalLM"],
        model_type="sdar_moe",
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        attention_bias=False,
        torch_dtype="float32",
        decoder_sparse_step=1,
        mlp_only_layers=[],
        mask_token_id=MASK,
        eos_token_id=END_OF_TEXT,
        **shape,
    )


QK_NORM_GAIN = 2**0.5
"""Initial q_norm / k_norm gain. NOTE: qk-norm caps an attention logit at gain_q * gain_k * sqrt(head_dim): 5.7
with unit gains and head_dim 32, too flat to single out one key among dozens; gains of sqrt(2) give the cap of a
head_dim-128 model (11.3), as in the large models this one stands in for."""


def init_sdar(config: dict[str, Any], seed: int) -> tuple[ModelArgs, nn.Module]:
    """GPT-2 style init: normal(0, 0.02) weights, output projections scaled down by depth, unit norms except
    the q/k norms (QK_NORM_GAIN)."""
    args = family_for(config).parse_args(config, {})
    model = family_for(config).model_cls(args, args.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(QK_NORM_GAIN if name.endswith(("q_norm.weight", "k_norm.weight")) else 1.0)
                continue
            std = 0.02 / math.sqrt(2 * args.num_layers) if name.endswith(("o_proj.weight", "down_proj")) else 0.02
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return args, model
