"""The config.json keys the diffusion_gemma family's parser reads or knows to be irrelevant (model/settings_check.py
reports every other one at load)."""

from diffuserve.model.known_settings import FamilySettings

SETTINGS = FamilySettings(
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
)
