"""The config.json keys the clover_moe family's parser reads or knows to be irrelevant (model/settings_check.py
reports every other one at load)."""

from diffuserve.model.known_settings import QWEN3_MOE, FamilySettings

SETTINGS = FamilySettings(
    QWEN3_MOE
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
    "diffuserve denoises each block with per-token top-k routing over all experts (or, with "
    "--block-expert-coreset C, within its own coreset of C experts) and its own reading of the "
    "block-diffusion GDN tensors, so its diffusion output may differ from the release's (decoder=verified "
    "keeps only what the causal path agrees with: the model's autoregressive output; `diffuserve verify` "
    "compares the causal trunk with the checkpoint's own code)",
)
