"""The bundled default model's shape and initialisation: a tiny `clover_moe` (the published Clover layout).

Owns the model shape (Gated DeltaNet and gated attention layers, 3 : 1 as Clover-35B-A3B; routed experts plus a
gated shared expert; the four block-diffusion GDN tensors), its config.json and the seeded initialisation.
Knows nothing of batches or of the optimisation loop.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, with_diffusion
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion

from .diffusion_batch import END_OF_TEXT, MASK

CLOVER_MOE_SHAPE: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=4,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    partial_rotary_factor=0.5,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    vocab_size=272,
    block_length=4,
    max_position_embeddings=1024,
)
"""Layers 0-2 GDN, layer 3 gated attention (`full_attention_interval` 4, as the published model); a byte-level
vocabulary (256 bytes, 4 specials, filler to a multiple of 16)."""

CLOVER_MOE_MIX: dict[str, float] = {
    "add": 2.0,
    "add_json": 0.5,
    "reverse": 1.0,
    "sort": 2.25,
    "copy": 1.5,
    "max": 0.75,
    "lookup": 1.75,
}
"""Training mix (eval.tasks.training_stream). On the sdar model's mix (addition 39 %) this model learned addition
and max completely by 3,000 steps but not sorting (60 %) or long copies (84.5 %), so those are drawn more often.
`add_json` (`27+15 in JSON` -> `{"answer": 42}`) teaches the JSON answer a schema constraint asks for; its prompt is
short so its rows are no longer than a sort's. docs/models/bundled.md has the runs behind this mix."""

CLOVER_MOE_TURNS: dict[int, float] = {1: 0.5, 2: 0.35, 3: 0.15}
"""Conversation lengths (eval.tasks.training_batches): half the batches are multi-turn, so that a chat's second
and third question (`diffuserve chat` sends the history back) is answered as the first; the first model, trained on
single turns, answered a second question with noise. Longer chats than 3 turns are not trained."""

QK_NORM_GAIN = 2**0.5
"""Initial q_norm / k_norm gain (see sdar_model.QK_NORM_GAIN: unit gains make head-dim-32 attention too flat)."""
PREVIEW_SHARPNESS = 4.0
"""Initial `bd_softmax_logit_scale` * Dk^-0.5: q and k are unit vectors and q is scaled by Dk^-0.5, so a block
logit starts as PREVIEW_SHARPNESS * cos(q, k)."""


def clover_moe_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The config.json of a clover_moe model with this shape and the byte tokenizer's special ids."""
    return {
        "architectures": ["CloverMoeModelLM"],
        "model_type": "clover_moe",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "float32",
        "diffusion_prediction_shift": True,
        "mask_token_id": MASK,
        "eos_token_id": END_OF_TEXT,
        **shape,
    }


def _special_value(name: str, param: torch.Tensor, args: ModelArgs, generator: torch.Generator) -> torch.Tensor | None:
    """The initial value of a parameter that is not a plain weight matrix, or None for those."""
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return torch.full(param.shape, QK_NORM_GAIN - 1.0)  # zero-centred: applied as 1 + weight
    if name.endswith("linear_attn.norm.weight"):
        return torch.ones(param.shape)  # the GDN output norm is applied as is
    if name.endswith("norm.weight") or name.endswith(("bd_softmax_history_bias", "conv_right_weight")):
        return torch.zeros(param.shape)  # unit gains; no history preference; the right taps start causal
    if name.endswith("bd_softmax_history_c"):
        return torch.ones(param.shape)  # history weighted by the row's own decay exp(g)
    if name.endswith("bd_softmax_logit_scale"):
        return torch.full(param.shape, PREVIEW_SHARPNESS * args.extra["hybrid"].gdn.key_head_dim ** 0.5)
    if name.endswith("A_log"):
        return torch.empty(param.shape).uniform_(1.0, 16.0, generator=generator).log()
    if name.endswith("dt_bias"):
        # Mamba's init: dt log-uniform in [1e-3, 1e-1], stored as softplus^-1(dt), so g = -A dt starts slow.
        dt = torch.empty(param.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("conv1d.weight"):
        return torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[-1])
    return None


def init_clover_moe(config: dict[str, Any], seed: int) -> tuple[ModelArgs, CloverMoeForBlockDiffusion]:
    """GPT-2 style init for the matrices (normal(0, 0.02), output projections scaled down by depth), and the
    GDN / preview parameters in their working ranges (`_special_value`)."""
    args = with_diffusion(clover_moe_args_from_hf(config), True)
    model = CloverMoeForBlockDiffusion(args, args.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    depth_scale = 1 / math.sqrt(2 * args.num_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = _special_value(name, param, args, generator)
            if value is None:
                std = 0.02 * depth_scale if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj")) else 0.02
                value = torch.randn(param.shape, generator=generator) * std
            param.copy_(value)
    return args, model
