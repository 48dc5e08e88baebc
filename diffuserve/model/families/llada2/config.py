"""The llada2 family's config.json (BailingMoeV2 keys) -> ModelArgs. Standard library only."""

from __future__ import annotations

from typing import Any

from diffuserve.model.config import (
    ModelArgs,
    dense_layer_ids,
    eos_ids,
    first_field,
    parse_block_length,
    parse_rope,
    require_field,
)

# Defaults of the reference `LLaDA2MoeConfig` class, which apply when a config.json omits the key. They differ
# from the released configs (e.g. rms_norm_eps 1e-6 and use_bias false there): always read the JSON.
LLADA2_CONFIG_DEFAULTS: dict[str, Any] = dict(
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    partial_rotary_factor=0.5,
    max_position_embeddings=16384,
    tie_word_embeddings=False,
    use_qkv_bias=False,
    use_qk_norm=True,
    use_bias=True,
    num_shared_experts=0,
    first_k_dense_replace=0,
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
)


def llada2_args_from_hf(config: dict, generation_config: dict | None = None) -> ModelArgs:
    """Builds ModelArgs for LLaDA2.0 / LLaDA2.1 (`LLaDA2MoeModelLM`, BailingMoeV2 keys).

    `use_qkv_bias` is the q/k/v bias; `use_bias` (o_proj = `dense` bias), `use_qk_norm` and the router's
    `n_group`, `topk_group`, `routed_scaling_factor` go to `extra`. The reference ignores `norm_topk_prob`,
    `score_function`, `router_dtype`, `moe_router_enable_expert_bias` and `rotary_dim` (the rotated width is
    head_dim * partial_rotary_factor), and so do we. Released configs name no mask id and no EOS: the loader
    fills them from the tokenizer (see the family's `special_tokens`); generation_config.json may set them too.
    """
    generation_config = generation_config or {}
    config = {**LLADA2_CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    hidden = int(require_field(config, "hidden_size"))
    heads = int(require_field(config, "num_attention_heads"))
    layers = int(require_field(config, "num_hidden_layers"))
    experts = int(require_field(config, "num_experts"))
    moe_intermediate = int(require_field(config, "moe_intermediate_size"))
    mask_token_id = first_field(config, "mask_token_id", default=generation_config.get("mask_token_id"))
    if mask_token_id is None:
        raise ValueError(
            "config.json: missing field `mask_token_id`, and the tokenizer has no `<|mask|>` token to take it "
            "from; add `mask_token_id` to config.json"
        )
    return ModelArgs(
        architecture=(config.get("architectures") or ["?"])[0],
        vocab_size=int(require_field(config, "vocab_size")),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),  # 0 means "as many as query heads"
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config.get("intermediate_size") or 0),
        mask_token_id=int(mask_token_id),
        block_length=parse_block_length(config),
        num_experts=experts,
        num_experts_per_tok=int(require_field(config, "num_experts_per_tok")),
        moe_intermediate_size=moe_intermediate,
        shared_expert_intermediate_size=int(config["num_shared_experts"]) * moe_intermediate,
        dense_layer_ids=dense_layer_ids(config, layers, experts),
        rms_norm_eps=float(config["rms_norm_eps"]),
        rope=parse_rope(config),
        max_position_embeddings=int(config["max_position_embeddings"]),
        tie_word_embeddings=bool(config["tie_word_embeddings"]),
        attention_bias=bool(config["use_qkv_bias"]),
        eos_token_ids=eos_ids(config, generation_config),
        pad_token_id=config.get("pad_token_id"),
        torch_dtype=first_field(config, "torch_dtype", "dtype"),
        extra={
            key: config[key] for key in ("use_qk_norm", "use_bias", "n_group", "topk_group", "routed_scaling_factor")
        },
    )
