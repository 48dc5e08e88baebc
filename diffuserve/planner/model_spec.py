"""ModelSpec: the shape facts the planner needs, read from a Hugging Face style `config.json` dict.

Owns the translation of the config spellings of our model families (Qwen3-MoE / SDAR-MoE, LLaDA2 =
BailingMoeV2, Gemma-4 / DiffusionGemma with `text_config`, sliding-window `layer_types`, and the hybrid
Gated DeltaNet families through planner/hybrid_config.py) into layer groups.
The spellings the engine also reads (block length, which layers are dense) go through the model's own parser,
diffuserve/model/config.py (standard library only), so the two cannot disagree. Knows nothing of dtypes,
hardware or workloads; raises ValueError naming the config field and the fix.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from diffuserve.model.config import DEFAULT_BLOCK_LENGTH, dense_layer_ids, parse_block_length
from diffuserve.planner.hybrid_config import (
    FULL,
    LINEAR,
    SLIDING,
    LinearAttentionGroup,
    has_output_gate,
    has_shared_expert_gate,
    layer_types,
    linear_attention_group,
    with_family_defaults,
)


@dataclass(frozen=True)
class AttentionGroup:
    """Layers sharing one attention shape. Shape letters: Hq query heads, Hkv KV heads, D head dim."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None = None
    """Sliding-window length in tokens; None = full attention (KV grows with the context)."""
    has_v_proj: bool = True
    """False when V is derived from the K projection (Gemma-4 `attention_k_eq_v`); V is still cached."""
    output_gate: bool = False
    """Gated attention (Qwen3.5 / Clover): `q_proj` also emits a sigmoid gate per query head dim (2 x Hq x D)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    attention: tuple[AttentionGroup, ...]
    intermediate_size: int
    """Width of the dense gated MLP (SwiGLU / GeGLU: gate, up, down)."""
    num_dense_mlp_layers: int
    """Layers that run a dense MLP: the non-MoE layers, or every layer when the MoE runs beside it (Gemma-4)."""
    num_moe_layers: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    block_length: int = DEFAULT_BLOCK_LENGTH
    linear_attention: LinearAttentionGroup | None = None
    """Gated DeltaNet layers (hybrid models): no KV cache, a constant state per sequence."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by sigmoid of a [1, h] projection (Qwen2-MoE / Qwen3.5 / Clover)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def is_hybrid(self) -> bool:
        return self.linear_attention is not None

    @property
    def num_attention_layers(self) -> int:
        """Layers that keep K/V (full or sliding-window attention)."""
        return sum(group.num_layers for group in self.attention)

    @property
    def num_heads(self) -> int:
        return min(group.num_heads for group in self.attention)


def spec_from_config(config: dict[str, Any], name: str | None = None) -> ModelSpec:
    """Parses a config.json dict (top level, or the `text_config` of multimodal / DiffusionGemma configs)."""
    text = with_family_defaults(config, {**config, **(config.get("text_config") or {})})
    hidden = int(_require(text, "hidden_size"))
    layers = int(_require(text, "num_hidden_layers"))
    experts = int(_first(text, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)
    parallel_moe = _has_parallel_dense_mlp(text)
    moe_layers = _moe_layers(text, layers, experts)
    kinds = Counter(layer_types(text, layers))
    return ModelSpec(
        name=name or _model_name(config),
        architecture=(config.get("architectures") or text.get("architectures") or ["?"])[0],
        vocab_size=int(_require(text, "vocab_size")),
        hidden_size=hidden,
        num_layers=layers,
        attention=_attention_groups(config, text, kinds, hidden),
        intermediate_size=int(_first(text, "intermediate_size", default=0) or 0),
        num_dense_mlp_layers=layers if parallel_moe else layers - moe_layers,
        num_moe_layers=moe_layers,
        num_experts=experts,
        num_experts_per_tok=int(_first(text, "num_experts_per_tok", "top_k_experts", "moe_topk", default=0) or 0),
        moe_intermediate_size=int(_first(text, "moe_intermediate_size", "expert_intermediate_size", default=0) or 0),
        shared_expert_intermediate_size=_shared_width(text),
        tie_word_embeddings=bool(_first(text, "tie_word_embeddings", default=False)),
        max_position_embeddings=int(_first(text, "max_position_embeddings", default=32768)),
        block_length=parse_block_length(config),
        linear_attention=linear_attention_group(text, kinds[LINEAR]) if kinds[LINEAR] else None,
        shared_expert_gate=has_shared_expert_gate(config) and _shared_width(text) > 0,
    )


def _require(config: dict, key: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"config.json: missing field `{key}`; the planner needs it to size the model")
    return config[key]


def _first(config: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _model_name(config: dict) -> str:
    return str(config.get("_name_or_path") or (config.get("architectures") or ["model"])[0])


def _has_parallel_dense_mlp(text: dict) -> bool:
    """Gemma-4 MoE layers run a dense MLP *and* the experts side by side; Qwen3-MoE / LLaDA2 replace it."""
    return str(text.get("model_type", "")).startswith(("gemma4", "diffusion_gemma"))


def _values_from_keys(text: dict) -> bool:
    """Full layers without v_proj: DiffusionGemma's always (transformers builds v_proj on sliding layers only;
    its config.json has no flag for it), Gemma-4's when `attention_k_eq_v` says so."""
    return str(text.get("model_type", "")).startswith("diffusion_gemma") or bool(text.get("attention_k_eq_v"))


def _moe_layers(text: dict, layers: int, experts: int) -> int:
    """Counts MoE layers from the three spellings of "this layer is dense": Qwen3-MoE `mlp_only_layers` and
    `decoder_sparse_step`, DeepSeek / LLaDA2 `first_k_dense_replace`."""
    if experts == 0 or text.get("enable_moe_block") is False:
        return 0
    return layers - len(dense_layer_ids(text, layers, experts) & set(range(layers)))


def _shared_width(text: dict) -> int:
    width = int(_first(text, "shared_expert_intermediate_size", default=0) or 0)
    if not width and text.get("num_shared_experts"):
        width = int(text["num_shared_experts"]) * int(_require(text, "moe_intermediate_size"))
    return width


def _attention_groups(config: dict, text: dict, kinds: Counter[str], hidden: int) -> tuple[AttentionGroup, ...]:
    if not kinds[FULL] + kinds[SLIDING]:
        raise ValueError(
            "config.json: no layer is full or sliding-window attention (`layer_types` / `full_attention_interval`)"
            "; the planner models hybrids with at least one attention layer"
        )
    heads = int(_require(text, "num_attention_heads"))
    kv_heads = int(_first(text, "num_key_value_heads", default=heads))
    head_dim = int(_first(text, "head_dim", default=hidden // heads))
    groups = []
    if kinds[SLIDING]:
        window = int(_require(text, "sliding_window"))
        groups.append(AttentionGroup(kinds[SLIDING], heads, kv_heads, head_dim, window=window))
    if kinds[FULL]:
        # Gemma-4 full-attention layers have their own KV heads / head dim and may reuse K as V.
        groups.append(
            AttentionGroup(
                kinds[FULL],
                heads,
                int(_first(text, "num_global_key_value_heads", default=kv_heads)),
                int(_first(text, "global_head_dim", default=head_dim)),
                has_v_proj=not _values_from_keys(text),
                output_gate=has_output_gate(config, text),
            )
        )
    return tuple(groups)
