"""Hybrid models in config.json: which layers are Gated DeltaNet (linear attention) and what shape they have.

Owns the spellings of the hybrid families (Clover `clover_moe`, its Qwen3.5/3.6-MoE trunk `qwen3_5_moe` /
`qwen3_5_moe_text`, Qwen3-Next `qwen3_next`): the layer pattern (`layer_types`, or `full_attention_interval`:
every interval-th layer is full attention), the linear-attention heads and dims, the conv kernel, the gated
attention output and the gated shared expert, and the defaults those families take from transformers'
`Qwen3_5MoeTextConfig` when a field is omitted. Standard library only; reads no other diffuserve module, so the
planner never depends on the engine's model code. Knows nothing of dtypes, devices or workloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"
LAYER_TYPES = (FULL, SLIDING, LINEAR)

QWEN3_5_MOE_TYPES = ("clover_moe", "qwen3_5_moe", "qwen3_5_moe_text")
"""Families whose omitted fields take transformers' `Qwen3_5MoeTextConfig` defaults (the 35B-A3B shape)."""
GATED_ATTENTION_TYPES = (*QWEN3_5_MOE_TYPES, "qwen3_next")
"""Families whose full-attention `q_proj` also emits a sigmoid output gate per head dim (twice the width)."""
GATED_SHARED_EXPERT_TYPES = (*GATED_ATTENTION_TYPES, "qwen2_moe")
"""Families whose shared expert is scaled by `sigmoid(shared_expert_gate(x))`, a [1, hidden] projection."""
QWEN3_5_MOE_DEFAULTS: dict[str, Any] = dict(
    num_key_value_heads=2,
    head_dim=256,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts_per_tok=8,
    num_experts=256,
    full_attention_interval=4,
)
"""transformers 5.x `Qwen3_5MoeTextConfig` defaults; the size-defining fields (hidden, layers, heads, vocab)
are left out so a config that omits them is an error, not a silent 35B."""

LINEAR_FIELDS = (
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


@dataclass(frozen=True)
class LinearAttentionGroup:
    """Gated DeltaNet layers. Shape letters: Hk key heads x Dk, Hv value heads x Dv (Hv / Hk value heads share
    a key head), a depthwise causal conv of width k over q | k | v. They cache no K/V: each sequence holds a
    constant state, S [Hv, Dk, Dv] and the conv ring [conv_dim, k - 1], whatever its length."""

    num_layers: int
    num_key_heads: int
    key_head_dim: int
    num_value_heads: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv and of the fused in-projection: q | k | v = 2 Hk Dk + Hv Dv."""
        return 2 * self.key_dim + self.value_dim


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
    key_heads, value_heads = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
    if key_heads < 1 or value_heads % key_heads:
        raise ValueError(
            f"config.json: `linear_num_value_heads` {value_heads} is not a multiple of `linear_num_key_heads` "
            f"{key_heads}; value heads share key heads in whole groups"
        )
    kernel = int(text["linear_conv_kernel_dim"])
    if kernel < 1:
        raise ValueError(f"config.json: `linear_conv_kernel_dim` is {kernel}; it must be >= 1")
    return LinearAttentionGroup(
        num_layers=num_layers,
        num_key_heads=key_heads,
        key_head_dim=int(text["linear_key_head_dim"]),
        num_value_heads=value_heads,
        value_head_dim=int(text["linear_value_head_dim"]),
        conv_kernel=kernel,
    )


def has_output_gate(config: dict, text: dict) -> bool:
    """Gated attention: `attn_output_gate` when the config says, else the family's default."""
    if text.get("attn_output_gate") is not None:
        return bool(text["attn_output_gate"])
    return bool(model_types(config) & set(GATED_ATTENTION_TYPES))


def has_shared_expert_gate(config: dict) -> bool:
    return bool(model_types(config) & set(GATED_SHARED_EXPERT_TYPES))
