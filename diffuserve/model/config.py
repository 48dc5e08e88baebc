"""ModelArgs: one normalised view of a Hugging Face style `config.json`.

Owns the translation of the many spellings found in real configs (transformers 4.x and 5.x, SDAR, SDAR-MoE and
our own small models, LLaDA2's BailingMoeV2 keys) into one frozen dataclass, so layers never call
`getattr(config, ...)`. Knows nothing of weights or requests. Standard library only, never torch: the planner
(diffuserve/planner/model_spec.py) reads config.json through the same key spellings (`parse_block_length`,
`dense_layer_ids`), so what it sizes is what the engine loads. Every user-facing problem raises `ValueError`
naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
BLOCK_LENGTH_KEYS = ("block_length", "block_size", "bd_size", "canvas_length")
"""Spellings of the diffusion block length, first present wins: ours, SDAR / Fast-dLLM, SDAR's `bd_size`,
DiffusionGemma's `canvas_length`. The planner reads the same keys through `parse_block_length`."""
DEFAULT_BLOCK_LENGTH = 32
"""LLaDA2 configs carry no block field; its tech report (and every family's reference) decodes with blocks of 32."""


@dataclass(frozen=True)
class RopeArgs:
    """Rotary embedding settings, normalised from `rope_theta` + `rope_scaling` (4.x) or `rope_parameters` (5.x)."""

    theta: float = 10000.0
    rope_type: str = "default"
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    # YaRN knobs (None = the paper's defaults, as in transformers).
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    # Llama-3 knobs.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0


@dataclass(frozen=True)
class ModelArgs:
    """Shape and semantics of a block-diffusion transformer. Shape letters: H hidden, D head dim, E experts."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    """Width of the dense (non-MoE) MLP layers."""
    mask_token_id: int
    block_length: int
    num_experts: int = 0
    """0 means a dense model (every layer uses the dense MLP)."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    """0 means no shared expert; otherwise an always-on SwiGLU expert of this width beside the routed ones."""
    dense_layer_ids: frozenset[int] = frozenset()
    """Layers that use the dense MLP although the model has experts."""
    rms_norm_eps: float = 1e-6
    rope: RopeArgs = field(default_factory=RopeArgs)
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Family-specific fields (e.g. LLaDA2 router groups), read only by that family's modules."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer_id: int) -> bool:
        return self.is_moe and layer_id not in self.dense_layer_ids

    def replace(self, **changes: Any) -> ModelArgs:
        return dataclasses.replace(self, **changes)


def require_field(config: dict, key: str, *aliases: str) -> Any:
    for name in (key, *aliases):
        if config.get(name) is not None:
            return config[name]
    names = " / ".join((key, *aliases))
    raise ValueError(f"config.json: missing field `{names}`; add it to the model's config.json")


def first_field(config: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def parse_rope(config: dict) -> RopeArgs:
    """Reads `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (transformers 4)."""
    params = dict(config.get("rope_parameters") or {})
    params.update(config.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "su":
        rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    theta = first_field(params, "rope_theta", default=first_field(config, "rope_theta", default=10000.0))
    partial = first_field(
        params, "partial_rotary_factor", default=first_field(config, "partial_rotary_factor", default=1.0)
    )
    original = first_field(config, "original_max_position_embeddings")
    original = first_field(params, "original_max_position_embeddings", default=original)
    if rope_type in ("yarn", "llama3") and original is None:
        original = config.get("max_position_embeddings")
    factor = params.get("factor")
    if factor is None and rope_type == "yarn" and original:
        factor = config["max_position_embeddings"] / original
    if rope_type != "default" and factor is None:
        raise ValueError(f"config.json: rope scaling {rope_type!r} needs `factor`; add it to `rope_scaling`")
    return RopeArgs(
        theta=float(theta),
        rope_type=rope_type,
        partial_rotary_factor=float(partial),
        factor=float(factor or 1.0),
        original_max_position_embeddings=original,
        beta_fast=params.get("beta_fast"),
        beta_slow=params.get("beta_slow"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=params.get("truncate", True),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    )


def parse_block_length(config: dict) -> int:
    """The block length under any of BLOCK_LENGTH_KEYS (DEFAULT_BLOCK_LENGTH when none is present)."""
    value = int(first_field(config, *BLOCK_LENGTH_KEYS, default=DEFAULT_BLOCK_LENGTH))
    if value < 1:
        key = next(k for k in BLOCK_LENGTH_KEYS if config.get(k) is not None)
        raise ValueError(f"config.json: `{key}` is {value}; a block length must be >= 1")
    return value


BLOCK_EXPERT_CORESET_KEYS = (
    "block_expert_coreset",
    "expert_coreset_size",
    "block_coreset_size",
    "coreset_size",
    "num_coreset_experts",
)
"""Spellings of the block expert coreset size C (model/layers/moe/coreset.py), first present wins, at the top
level or in `text_config`: ours (the --block-expert-coreset flag's name), then the likely names of a release's
block-diffusion record. A missing key, or 0, is per-token routing."""


def parse_block_expert_coreset(config: dict) -> int:
    """C under any of BLOCK_EXPERT_CORESET_KEYS (0 when none is present)."""
    for scope in (config, config.get("text_config") or {}):
        value = first_field(scope, *BLOCK_EXPERT_CORESET_KEYS)
        if value is not None:
            if type(value) is not int or value < 0:
                key = next(k for k in BLOCK_EXPERT_CORESET_KEYS if scope.get(k) is not None)
                raise ValueError(f"config.json: `{key}` is {value!r}; a block expert coreset is an integer >= 0")
            return value
    return 0


def eos_ids(config: dict, generation_config: dict) -> tuple[int, ...]:
    ids = first_field(generation_config, "eos_token_id", default=config.get("eos_token_id"))
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, list) else (int(ids),)


def dense_layer_ids(config: dict, num_layers: int, num_experts: int) -> frozenset[int]:
    """Union of the three spellings of "this layer is dense": Qwen3-MoE's `mlp_only_layers` and
    `decoder_sparse_step`, DeepSeek/LLaDA2's `first_k_dense_replace`."""
    if num_experts == 0:
        return frozenset(range(num_layers))
    dense = set(config.get("mlp_only_layers") or [])
    step = int(config.get("decoder_sparse_step") or 1)
    dense |= {i for i in range(num_layers) if (i + 1) % step != 0}
    dense |= set(range(int(config.get("first_k_dense_replace") or 0)))
    return frozenset(dense)


def qwen3_args_from_hf(config: dict, generation_config: dict | None = None) -> ModelArgs:
    """Builds ModelArgs for the Qwen3 / Qwen3-MoE shaped sdar family (SDAR, SDAR-MoE, Qwen3)."""
    generation_config = generation_config or {}
    hidden = int(require_field(config, "hidden_size"))
    heads = int(require_field(config, "num_attention_heads"))
    layers = int(require_field(config, "num_hidden_layers"))
    experts = int(first_field(config, "num_experts", "num_local_experts", default=0))
    shared = int(first_field(config, "shared_expert_intermediate_size", default=0))
    if not shared and config.get("num_shared_experts"):
        shared = int(config["num_shared_experts"]) * int(require_field(config, "moe_intermediate_size"))
    return ModelArgs(
        architecture=(config.get("architectures") or ["?"])[0],
        vocab_size=int(require_field(config, "vocab_size")),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(first_field(config, "num_key_value_heads", default=heads)),
        head_dim=int(first_field(config, "head_dim", default=hidden // heads)),
        intermediate_size=int(first_field(config, "intermediate_size", default=0)),
        mask_token_id=int(require_field(config, "mask_token_id")),
        block_length=parse_block_length(config),
        num_experts=experts,
        num_experts_per_tok=int(first_field(config, "num_experts_per_tok", default=0)),
        moe_intermediate_size=int(first_field(config, "moe_intermediate_size", default=0)),
        norm_topk_prob=bool(first_field(config, "norm_topk_prob", default=False)),
        shared_expert_intermediate_size=shared,
        dense_layer_ids=dense_layer_ids(config, layers, experts),
        rms_norm_eps=float(first_field(config, "rms_norm_eps", default=1e-6)),
        rope=parse_rope(config),
        max_position_embeddings=int(first_field(config, "max_position_embeddings", default=32768)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False)),
        eos_token_ids=eos_ids(config, generation_config),
        pad_token_id=config.get("pad_token_id"),
        torch_dtype=first_field(config, "torch_dtype", "dtype"),
    )
