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
        "block_expert_coreset",
        "expert_coreset_size",
        "block_coreset_size",
        "coreset_size",
        "num_coreset_experts",
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
    """What one family's parser reads (`understood`), knows not to matter (`irrelevant`), and does instead of
    a diffusion or routing setting it does not implement. Each family's record carries its own
    (`ModelFamily.settings`, in the family's folder)."""

    understood: frozenset[str]
    irrelevant: frozenset[str]
    instead: str
    """What the engine does, said after a diffusion or routing setting it does not implement."""


QWEN3_MOE = frozenset(
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
"""The experts keys of Qwen3-MoE-shaped configs, which several families' parsers read."""


NO_SETTINGS = FamilySettings(frozenset(), frozenset(), "diffuserve does not implement it")
"""A family that declares none: every key beyond the common ones is reported."""
