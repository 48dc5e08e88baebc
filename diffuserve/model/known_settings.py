"""Which config.json keys each family understands, which it knows to be irrelevant, and what the engine does
instead of a diffusion or routing setting it does not implement. Data only (settings_check.py reads it);
standard library only.

"Understood" means a family's config parser reads the key (model/config.py, clover_moe_config.py,
diffusion_gemma_config.py, loader and quant/ for the shared ones). "Irrelevant" means the key cannot change what
the engine computes at inference: training knobs (dropout, initialisation, losses), transformers' bookkeeping,
and keys whose only value in released checkpoints is the one the engine implements (`use_sliding_window: false`).
"""

from __future__ import annotations

from dataclasses import dataclass

COMMON_UNDERSTOOD = frozenset(
    {
        "architectures",
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "eos_token_id",
        "pad_token_id",
        "mask_token_id",
        "torch_dtype",
        "dtype",
        "block_length",
        "block_size",
        "bd_size",
        "quantization_config",
        "text_config",
        "hidden_act",  # SiLU in every family but DiffusionGemma, whose parser reads `hidden_activation`
    }
)
"""Read by every family's parser (through model/config.py's shared helpers), the loader or the quantized loader."""

COMMON_IRRELEVANT = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "auto_map",
        "use_cache",
        "initializer_range",
        "initializer_factor",
        "attention_dropout",
        "hidden_dropout",
        "embedding_dropout",
        "output_dropout",
        "dropout",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "router_aux_loss_coef",
        "return_dict",
        "torchscript",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "id2label",
        "label2id",
        "problem_type",
        "bos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "tokenizer_class",
        "task_specific_params",
        "attn_implementation",
        "_attn_implementation_autoset",
        "fuse_cross_entropy",
        "gradient_checkpointing",
        "pretraining_tp",
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "original_max_position_embeddings",
    }
)
"""Training, bookkeeping and attention-implementation keys of transformers-written configs (the Qwen3 family's
sliding-window keys are off in every released SDAR / Qwen3 checkpoint)."""


@dataclass(frozen=True)
class FamilySettings:
    understood: frozenset[str]
    irrelevant: frozenset[str]
    instead: str
    """What the engine does, said after a diffusion or routing setting it does not implement."""


_QWEN3_MOE = frozenset(
    {
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "shared_expert_intermediate_size",
        "num_shared_experts",
        "mlp_only_layers",
        "decoder_sparse_step",
        "first_k_dense_replace",
        "layer_types",
    }
)

FAMILIES: dict[str, FamilySettings] = {
    "sdar": FamilySettings(
        _QWEN3_MOE,
        frozenset(),
        "diffuserve decodes each block with its own decoders (SamplingParams: threshold, steps, ...) and per-token "
        "top-k routing",
    ),
    "llada2": FamilySettings(
        _QWEN3_MOE | {"use_qkv_bias", "use_bias", "use_qk_norm", "n_group", "topk_group", "routed_scaling_factor"},
        frozenset(
            {
                "score_function",
                "router_dtype",
                "rotary_dim",
                "moe_router_enable_expert_bias",
                "use_rmsnorm",
                "num_nextn_predict_layers",
                "mtp_loss_scaling_factor",
                "using_split_qkv_in_self_attention",
            }
        ),
        "diffuserve decodes each block with its own decoders (SamplingParams: threshold, steps, ...) and the "
        "group-limited top-k router per token",
    ),
    "clover_moe": FamilySettings(
        _QWEN3_MOE
        | {
            "full_attention_interval",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "diffusion_prediction_shift",
        },
        frozenset(
            {
                "vision_config",
                "image_token_id",
                "video_token_id",
                "vision_start_token_id",
                "vision_end_token_id",
                "mtp_num_hidden_layers",
                "mtp_use_dedicated_embeddings",
                "attn_output_gate",
                "mamba_ssm_dtype",
            }
        ),
        "diffuserve denoises each block with per-token top-k routing over all experts and its own reading of the "
        "block-diffusion GDN tensors, so its diffusion output may differ from the release's (decoder=verified "
        "keeps only what the causal path agrees with: the model's autoregressive output; `diffuserve verify` "
        "compares the causal trunk with the checkpoint's own code)",
    ),
    "diffusion_gemma": FamilySettings(
        frozenset(
            {
                "canvas_length",
                "layer_types",
                "num_experts",
                "top_k_experts",
                "moe_intermediate_size",
                "global_head_dim",
                "num_global_key_value_heads",
                "attention_k_eq_v",
                "final_logit_softcapping",
                "hidden_activation",
                "per_layer_config",
                "use_bidirectional_attention",
            }
        ),
        frozenset({"vision_config", "boi_token_id", "eoi_token_id", "image_token_id"}),
        "diffuserve decodes each canvas with its renoise decoder (SamplingParams and generation_config.json)",
    ),
}
