"""ModelArgs for the `clover_moe` family: Clover-35B-A3B-Preview and its Qwen3.5/3.6-MoE text trunk.

Owns the reading of a `clover_moe` / `qwen3_5_moe(_text)` config.json (text fields at the top level or under
`text_config`; the layer pattern as `layer_types` or `full_attention_interval`) into `ModelArgs`, whose `extra`
carries the hybrid part as one `HybridArgs`. Defaults are those of transformers' `Qwen3_5MoeTextConfig`, which a
real config.json overrides. No torch: the planner and the engine's control plane may import it. Every problem is
a one-line `ValueError` naming the field, the value and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from diffuserve.model.config import ModelArgs, eos_ids, first_field, parse_rope, require_field
from diffuserve.model.shapes import CacheLayout, PagedKV, RecurrentState

LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
NO_MASK_TOKEN = -1
"""`mask_token_id` of a checkpoint that names none: it can only run autoregressively."""

# transformers' Qwen3_5MoeTextConfig defaults (the 35B-A3B shape), used where a config.json omits a field.
TEXT_DEFAULTS: dict[str, Any] = dict(
    num_key_value_heads=2,
    head_dim=256,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
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
    partial_rotary_factor=0.25,
)


@dataclass(frozen=True)
class GdnArgs:
    """Sizes of a Gated DeltaNet layer. Key heads are shared by value heads (Hv / Hk each)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    """Depthwise causal conv width k; the conv ring keeps the last k - 1 inputs."""

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: q | k | v."""
        return 2 * self.key_dim + self.value_dim

    def layer_params(self, hidden_size: int, has_diffusion: bool = False) -> int:
        """Parameters of one GDN layer: in_proj_qkv h x conv_dim, in_proj_z h x Hv*Dv, in_proj_b and in_proj_a
        h x Hv each, out_proj Hv*Dv x h, the depthwise conv conv_dim x k, A_log and dt_bias Hv each, the gated
        RMSNorm Dv; with the block-diffusion tensors also conv_right_weight conv_dim x (k - 1) and the three
        bd_softmax_* Hv each."""
        hv = self.num_value_heads
        params = (
            hidden_size * (self.conv_dim + self.value_dim + 2 * hv)
            + self.value_dim * hidden_size
            + self.conv_dim * self.conv_kernel
            + 2 * hv
            + self.value_head_dim
        )
        return params + (self.conv_dim * (self.conv_kernel - 1) + 3 * hv if has_diffusion else 0)


@dataclass(frozen=True)
class HybridArgs:
    """The part of a clover_moe model that ModelArgs has no words for (kept in `ModelArgs.extra["hybrid"]`)."""

    layer_types: tuple[str, ...]
    gdn: GdnArgs
    shared_expert_gate: bool = True
    prediction_shift: bool = True
    """True: a masked position is predicted from the previous position's output (AR shift, next-token); False:
    from its own position's output (SDAR, LLaDA). config.json `diffusion_prediction_shift`; docs/models/clover.md."""
    has_diffusion: bool = False
    """The checkpoint carries the block-diffusion GDN tensors (set from its tensor names, not from config.json)."""

    def is_gdn(self, layer_id: int) -> bool:
        return self.layer_types[layer_id] == LINEAR_ATTENTION


def hybrid_args(args: ModelArgs) -> HybridArgs:
    return args.extra["hybrid"]


def text_fields(config: dict) -> dict:
    """The text model's fields: `text_config` (multimodal Qwen3.5 layout) over the top level."""
    text = config.get("text_config") or {}
    return {**TEXT_DEFAULTS, **{k: v for k, v in config.items() if k != "text_config"}, **text}


def _text_rope(fields: dict) -> dict:
    """mRoPE ("mrope", with `mrope_section`) gives text tokens the same position on all three axes, which is plain
    1-D RoPE: read it as the default rope type."""
    fields = dict(fields)
    for key in ("rope_parameters", "rope_scaling"):
        params = fields.get(key)
        if params and "mrope" in (params.get("rope_type"), params.get("type")):
            fields[key] = {k: v for k, v in params.items() if k not in ("rope_type", "type")}
    return fields


def _layer_types(fields: dict, num_layers: int) -> tuple[str, ...]:
    types = _listed_layer_types(fields, num_layers)
    if FULL_ATTENTION not in types:
        source = (
            "`layer_types`"
            if fields.get("layer_types") is not None
            else f"`full_attention_interval` over {num_layers} layers"
        )
        raise ValueError(
            f"config.json: {source} gives no {FULL_ATTENTION!r} layer; diffuserve runs clover_moe models with at "
            "least one (the engine's K/V pages are the attention layers'), as every published one has"
        )
    return types


def _listed_layer_types(fields: dict, num_layers: int) -> tuple[str, ...]:
    types = fields.get("layer_types")
    if types is None:
        interval = int(fields["full_attention_interval"])
        if interval < 1:
            raise ValueError(f"config.json: `full_attention_interval` is {interval}; expected a positive integer")
        return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers))
    if len(types) != num_layers:
        raise ValueError(
            f"config.json: `layer_types` has {len(types)} entries, expected num_hidden_layers = {num_layers}"
        )
    unknown = sorted({t for t in types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)})
    if unknown:
        raise ValueError(
            f"config.json: `layer_types` contains {unknown}; expected only {LINEAR_ATTENTION!r} / {FULL_ATTENTION!r}"
        )
    return tuple(types)


def _check_divides(fields: dict, numerator: str, denominator: str) -> None:
    num, den = int(fields[numerator]), int(fields[denominator])
    if den < 1 or num % den:
        raise ValueError(
            f"config.json: `{numerator}` = {num} is not a multiple of `{denominator}` = {den}; "
            f"expected {denominator} to divide {numerator}"
        )


def gdn_args(fields: dict) -> GdnArgs:
    """The Gated DeltaNet shape from config.json's `linear_*` fields (the planner reads it here too)."""
    _check_divides(fields, "linear_num_value_heads", "linear_num_key_heads")
    kernel = int(fields["linear_conv_kernel_dim"])
    if kernel < 2:
        raise ValueError(f"config.json: `linear_conv_kernel_dim` is {kernel}; expected at least 2")
    return GdnArgs(
        int(fields["linear_num_key_heads"]),
        int(fields["linear_num_value_heads"]),
        int(fields["linear_key_head_dim"]),
        int(fields["linear_value_head_dim"]),
        kernel,
    )


def clover_moe_args_from_hf(config: dict, generation_config: dict | None = None) -> ModelArgs:
    """Builds ModelArgs for `CloverMoeModelLM` / `Qwen3_5MoeForCausalLM` configs (see module docstring)."""
    generation_config = generation_config or {}
    fields = text_fields(config)
    layers = int(require_field(fields, "num_hidden_layers"))
    heads = int(require_field(fields, "num_attention_heads"))
    _check_divides(fields, "num_attention_heads", "num_key_value_heads")
    shared = int(fields["shared_expert_intermediate_size"])
    if shared < 1:
        raise ValueError(f"config.json: `shared_expert_intermediate_size` is {shared}; expected a positive width")
    mask_token_id = first_field(fields, "mask_token_id", default=generation_config.get("mask_token_id"))
    hybrid = HybridArgs(
        _layer_types(fields, layers),
        gdn_args(fields),
        prediction_shift=bool(fields.get("diffusion_prediction_shift", True)),
    )
    return ModelArgs(
        architecture=(config.get("architectures") or ["?"])[0],
        vocab_size=int(require_field(fields, "vocab_size")),
        hidden_size=int(require_field(fields, "hidden_size")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(fields["num_key_value_heads"]),
        head_dim=int(fields["head_dim"]),
        intermediate_size=0,
        mask_token_id=NO_MASK_TOKEN if mask_token_id is None else int(mask_token_id),
        block_length=int(first_field(fields, "block_length", "block_size", "bd_size", default=32)),
        num_experts=int(fields["num_experts"]),
        num_experts_per_tok=int(fields["num_experts_per_tok"]),
        moe_intermediate_size=int(fields["moe_intermediate_size"]),
        norm_topk_prob=True,  # the Qwen3.5 router always renormalises its top-k
        shared_expert_intermediate_size=shared,
        rms_norm_eps=float(fields["rms_norm_eps"]),
        rope=parse_rope(_text_rope(fields)),
        max_position_embeddings=int(fields["max_position_embeddings"]),
        tie_word_embeddings=bool(fields["tie_word_embeddings"]),
        attention_bias=bool(fields["attention_bias"]),
        eos_token_ids=eos_ids(fields, generation_config),
        pad_token_id=fields.get("pad_token_id"),
        torch_dtype=first_field(fields, "torch_dtype", "dtype"),
        extra={"hybrid": hybrid},
    )


def with_diffusion(args: ModelArgs, has_diffusion: bool) -> ModelArgs:
    """args whose HybridArgs say whether the checkpoint carries the block-diffusion tensors."""
    if has_diffusion and args.mask_token_id == NO_MASK_TOKEN:
        raise ValueError(
            "config.json: missing field `mask_token_id`, which a checkpoint with block-diffusion "
            "tensors needs; add the mask token's id to config.json"
        )
    return args.replace(extra={**args.extra, "hybrid": replace(hybrid_args(args), has_diffusion=has_diffusion)})


def cache_layout(args: ModelArgs, dtype: str) -> CacheLayout:
    """Per layer: a GDN layer's recurrent state (S in fp32, the conv ring in `dtype`) or an attention layer's
    K/V pages."""
    hybrid = hybrid_args(args)
    gdn = hybrid.gdn
    state = RecurrentState(
        gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim, gdn.conv_kernel, dtype
    )
    kv = PagedKV(args.num_kv_heads, args.head_dim, dtype)
    return CacheLayout(tuple(state if hybrid.is_gdn(i) else kv for i in range(args.num_layers)))
