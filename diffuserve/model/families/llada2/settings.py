"""The config.json keys the llada2 family's parser reads or knows to be irrelevant (model/settings_check.py
reports every other one at load)."""

from diffuserve.model.known_settings import QWEN3_MOE, FamilySettings

SETTINGS = FamilySettings(
    QWEN3_MOE
    | {"use_qkv_bias", "use_bias", "use_qk_norm", "n_group", "topk_group", "routed_scaling_factor"}
    | {"core_threshold", "mode"},  # dMoE's block-expert gate (model/layers/moe/coreset_rule.py)
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
)
