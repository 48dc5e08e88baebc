"""Hybrid models in config.json: which layers are Gated DeltaNet (linear attention) and what shape they have.

Owns the spellings of the hybrid families (Clover `clover_moe`, its Qwen3.5/3.6-MoE trunk `qwen3_5_moe` /
`qwen3_5_moe_text`, Qwen3-Next `qwen3_next`): the layer pattern (`layer_types`, or `full_attention_interval`:
every interval-th layer is full attention), the linear-attention heads and dims, the conv kernel, the gated
attention output and the gated shared expert, and the defaults those families take from transformers'
`Qwen3_5MoeTextConfig` when a field is omitted. The linear-attention shape, its checks and the family defaults
are the model's own (`model/families/clover_moe/config.py`, standard library only), so the planner and the engine cannot
read one config.json two ways. Knows nothing of dtypes, devices or workloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffuserve.model.families.clover_moe.config import TEXT_DEFAULTS, GdnArgs, gdn_args

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"
LAYER_TYPES = (FULL, SLIDING, LINEAR)

QWEN3_5_MOE_TYPES = ("clover_moe", "qwen3_5_moe", "qwen3_5_moe_text")
"""Families whose omitted fields take transformers' `Qwen3_5MoeTextConfig` defaults (the 35B-A3B shape)."""
GATED_ATTENTION_TYPES = (*QWEN3_5_MOE_TYPES, "qwen3_next")
"""Families whose full-attention `q_proj` also emits a sigmoid output gate per head dim (twice the width)."""
GATED_SHARED_EXPERT_TYPES = (*GATED_ATTENTION_TYPES, "qwen2_moe")
"""Families whose shared expert is scaled by `sigmoid(shared_expert_gate(x))`, a [1, hidden] projection."""
QWEN3_5_MOE_DEFAULTS: dict[str, Any] = TEXT_DEFAULTS
"""transformers 5.x `Qwen3_5MoeTextConfig` defaults, as the model reads them; the size-defining fields (hidden,
layers, heads, vocab) are left out so a config that omits them is an error, not a silent 35B."""

LINEAR_FIELDS = (
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


@dataclass(frozen=True)
class LinearAttentionGroup(GdnArgs):
    """The model's Gated DeltaNet shape (`GdnArgs`: Hk key heads x Dk, Hv value heads x Dv, Hv / Hk value heads
    sharing a key head, a depthwise causal conv of width k over q | k | v) and how many layers have it. They cache
    no K/V: each sequence holds a constant state, S [Hv, Dk, Dv] and the conv ring [conv_dim, k - 1], whatever its
    length."""

    num_layers: int = 0


def model_types(config: dict) -> set[str]:
    """The top-level and the text config's `model_type` (a multimodal config names both)."""
    text = config.get("text_config") or {}
    return {str(t) for t in (config.get("model_type"), text.get("model_type")) if t}


def with_family_defaults(config: dict, text: dict) -> dict:
    """The text fields with the family's defaults under them (Qwen3.5-MoE-shaped families only)."""
    if model_types(config) & set(QWEN3_5_MOE_TYPES):
        return {**QWEN3_5_MOE_DEFAULTS, **{k: v for k, v in text.items() if v is not None}}
    return text


def layer_types(text: dict, num_layers: int) -> list[str]:
    """Per-layer kinds from `layer_types`, `full_attention_interval`, or Qwen2/3's sliding-window keys."""
    types = text.get("layer_types")
    if types is not None:
        if len(types) != num_layers:
            raise ValueError(
                f"config.json: `layer_types` lists {len(types)} layers but num_hidden_layers is {num_layers}; "
                "make them agree"
            )
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(
                f"config.json: layer type(s) {unknown} are not modelled by the planner; supported: "
                f"{', '.join(LAYER_TYPES)}"
            )
        return list(types)
    if text.get("full_attention_interval") is not None:
        interval = int(text["full_attention_interval"])
        if interval < 1:
            raise ValueError(
                f"config.json: `full_attention_interval` is {interval}; it must be >= 1 (4: 3 "
                "linear-attention layers, then 1 full-attention layer)"
            )
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    if text.get("use_sliding_window") and text.get("sliding_window"):
        # Qwen2/Qwen3 semantics: layers from `max_window_layers` on use the sliding window.
        first_swa = int(text.get("max_window_layers") or 0)
        return [FULL if i < first_swa else SLIDING for i in range(num_layers)]
    return [FULL] * num_layers


def linear_attention_group(text: dict, num_layers: int) -> LinearAttentionGroup:
    """The Gated DeltaNet shape of `num_layers` linear-attention layers; every field is required."""
    missing = [key for key in LINEAR_FIELDS if text.get(key) is None]
    if missing:
        raise ValueError(
            f"config.json: {num_layers} layer(s) are linear_attention but `{missing[0]}` is missing; the planner "
            f"needs {', '.join(LINEAR_FIELDS)} to size their state"
        )
    return LinearAttentionGroup(**vars(gdn_args(text)), num_layers=num_layers)


def has_output_gate(config: dict, text: dict) -> bool:
    """Gated attention: `attn_output_gate` when the config says, else the family's default."""
    if text.get("attn_output_gate") is not None:
        return bool(text["attn_output_gate"])
    return bool(model_types(config) & set(GATED_ATTENTION_TYPES))


def has_shared_expert_gate(config: dict) -> bool:
    return bool(model_types(config) & set(GATED_SHARED_EXPERT_TYPES))
