"""Model presets: config.json excerpts of the models diffuserve serves, with where each number came from.

Owns the preset configs and their published parameter totals (so reports can show computed vs published).
Knows nothing of hardware. Every preset is parsed by `spec_from_config`, exactly like a user's config.json,
so a preset is only a shortcut for "this config.json".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffuserve.planner.model_spec import ModelSpec, spec_from_config


@dataclass(frozen=True)
class ModelPreset:
    name: str
    config: dict[str, Any]
    published_total: float | None
    published_active: float | None
    source: str
    default_tpf: float | None = None
    """Tokens per forward to assume when none is given or calibrated (None: the planner's generic default)."""


# Clover-35B-A3B(-Preview), DiffuSpace (Hugging Face Diffuspace/Clover-35B-A3B-Preview): the published hybrid
# architecture, gathered in ../shared/notes/clover.md. [V] = stated by a source about Clover, [B] = its base
# trunk as transformers 5.x implements it (`Qwen3_5MoeTextConfig()` defaults are exactly this 35B-A3B shape).
# The model's own config.json could not be read: a real one overrides every value (`diffuserve plan DIR`).
#   identity: model_type clover_moe [V: HF tags], architecture CloverMoeModelLM [V: llama.cpp converter];
#   40 layers = 30 Gated DeltaNet + 10 gated full attention [V: CMF card], 3 GDN then 1 attention
#   (full_attention_interval 4) [B]; 128K context: 131,072 tokens [V: wiki]; 32-token blocks [V: CMF card];
#   256 routed experts top-8 + one shared expert [V: CMF card], expert and shared widths 512, sigmoid-gated
#   shared expert [B]; hidden 2048, vocab 248,320 untied [B]; attention 16 query / 2 KV heads of dim 256,
#   sigmoid output gate, partial rotary 0.25 [B]; GDN 16 key heads x 128, 32 value heads x 128, conv kernel 4 [B].
# -> 34.66B total as transformers counts it, 3.45B active (2.44B without embeddings),
#    20 KiB of K/V per token, 61.4 MiB of GDN state per sequence (bf16).
_CLOVER = dict(
    architectures=["CloverMoeModelLM"],
    model_type="clover_moe",
    hidden_size=2048,
    num_hidden_layers=40,
    full_attention_interval=4,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    attn_output_gate=True,
    partial_rotary_factor=0.25,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_num_value_heads=32,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    vocab_size=248320,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    block_length=32,
)

# SDAR-30B-A3B(-Chat/-Sci): no SDAR-MoE config.json was readable; lmdeploy, SGLang and JetEngine all implement
# it as Qwen3-MoE, so these are the Qwen/Qwen3-30B-A3B config.json dims (hidden 2048, 48 layers, 32/4 heads,
# head_dim 128, 128 experts, top-8, moe_intermediate_size 768, vocab 151936, untied) with SDAR's
# max_position_embeddings 32768 (SDAR-4B/8B config.json) and block_size 4 (SDAR configs; SGLang DLLM_PARAMS).
_SDAR_30B = dict(
    architectures=["SDARMoeForCausalLM"],
    model_type="sdar_moe",
    hidden_size=2048,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=6144,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    block_size=4,
)

# LLaDA2.0-mini: huggingface.co/inclusionAI/LLaDA2.0-mini config.json, identical in LLaDA2.1-mini/config.json
# (read through the Hub pages) and in inclusionAI/dFactory configs/model_configs/llada2_mini/config.json.
# No block field in the config: block 32 from the tech report and SGLang's DLLM_PARAMS.
_LLADA2_MINI = dict(
    architectures=["LLaDA2MoeModelLM"],
    model_type="llada2_moe",
    hidden_size=2048,
    num_hidden_layers=20,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=5120,
    num_experts=256,
    num_experts_per_tok=8,
    num_shared_experts=1,
    moe_intermediate_size=512,
    first_k_dense_replace=1,
    vocab_size=157184,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    partial_rotary_factor=0.5,
)

# LLaDA2.0-flash: inclusionAI/dFactory configs/model_configs/llada2_flash/config.json @c29d72c (32 layers,
# hidden 4096, 32/4 heads x 128, intermediate 9216, 256 experts top-8 width 1024, 1 shared, layer 0 dense,
# vocab 157184, untied). That file says max_position_embeddings 16384 (a training setting); we use the
# LLaDA2.0 family's 32768 (LLaDA2.0-mini / 2.1-mini config.json).
_LLADA2_FLASH = dict(
    _LLADA2_MINI,
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    intermediate_size=9216,
    moe_intermediate_size=1024,
)

# dMoE-16B (FSCCS/dMoE-16B, fscdc/dMoE @a5b7679): LLaDA2.0-mini fine-tuned with learnable block experts; its
# training config (training/configs/model_configs/llada2_mini/config.json) is LLaDA2.0-mini's shape, and its
# configuration class adds the gate's `mode` "aggregate" and `core_threshold` 0.6 (the cumulative coreset rule).
_DMOE = dict(_LLADA2_MINI, mode="aggregate", core_threshold=0.6)

# DiffusionGemma-26B-A4B (google/diffusiongemma-26B-A4B-it): its config.json, as three independent public
# parsers quote it verbatim in their tests (mlxcel's `REAL_CONFIG_SNIPPET`, a C# loader's `RealConfigJson`
# fixture that "mirrors the verified config.json", a Python packer's `Layout`; read through the code search),
# all agreeing: text_config hidden 2816, 30 layers sliding:full 5:1, 16 query heads; sliding layers 8 KV heads x
# 256, window 1024, RoPE theta 1e4; full layers `global_head_dim` 512 with `num_global_key_value_heads` 2,
# proportional RoPE (0.25, theta 1e6), no v_proj (transformers' modeling: V is the K projection; the config
# carries no `attention_k_eq_v` flag); dense GeGLU 2112 beside 128 experts top-8 of width 704; vocab 262144,
# tied; 262144 positions; final_logit_softcapping 30; canvas_length 256. Independently: layers 30, window 1024,
# context 256K, canvas 256, 262K vocab, 128 experts top-8 in SGLang's DiffusionGemma cookbook and the model card
# (docs.sglang.io/cookbook/autoregressive/Google/DiffusionGemma; the card as mirrored by sota.borgcloud.ai), and
# in vLLM's recipe (recipes.vllm.ai/Google/diffusiongemma-26B-A4B-it). transformers' class defaults differ
# (sliding_window 512, hidden 2304): always read the JSON.
_DIFFUSION_GEMMA = dict(
    architectures=["DiffusionGemmaForBlockDiffusion"],
    model_type="diffusion_gemma",
    canvas_length=256,
    tie_word_embeddings=True,
    text_config=dict(
        model_type="diffusion_gemma_text",
        hidden_size=2816,
        num_hidden_layers=30,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        num_global_key_value_heads=2,
        global_head_dim=512,
        intermediate_size=2112,
        num_experts=128,
        top_k_experts=8,
        moe_intermediate_size=704,
        vocab_size=262144,
        tie_word_embeddings=True,
        max_position_embeddings=262144,
        sliding_window=1024,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 5,
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        use_bidirectional_attention="vision",
        eos_token_id=1,
        pad_token_id=0,
        dtype="bfloat16",
    ),
)
DIFFUSION_GEMMA_GENERATION_CONFIG = dict(
    max_denoising_steps=48,
    sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
    t_min=0.4,
    t_max=0.8,
    stability_threshold=1,
    confidence_threshold=0.005,
    max_new_tokens=256,
    eos_token_id=[1, 106, 50],
    pad_token_id=0,
)
"""Its generation_config.json as the same parsers quote it (vLLM's recipe: "sets max_tokens: 256")."""

MODEL_PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        ModelPreset(
            "Clover-35B-A3B",
            _CLOVER,
            35e9,
            3e9,
            "DiffuSpace Clover-35B-A3B-Preview (wiki, CMF card, llama.cpp converter): 35B total, ~3B "
            "active, 40 layers 30 GDN + 10 attention, 256 experts top-8 + shared, block 32, 131,072 "
            "context; trunk dims from transformers' Qwen3_5MoeTextConfig (its base)",
        ),
        ModelPreset(
            "SDAR-30B-A3B",
            _SDAR_30B,
            30.5e9,
            3.3e9,
            "Qwen3-30B-A3B config.json dims (SDAR-MoE = Qwen3-MoE); totals from the Qwen3-30B-A3B card",
        ),
        ModelPreset(
            "LLaDA2.0-mini",
            _LLADA2_MINI,
            16e9,
            1.4e9,
            "inclusionAI/LLaDA2.0-mini config.json; totals from its model card (16B, 1.4B active, 789M non-embedding)",
        ),
        ModelPreset(
            "LLaDA2.0-flash",
            _LLADA2_FLASH,
            100e9,
            6.1e9,
            "inclusionAI/dFactory llada2_flash config.json; totals from the model card (100BA6B; "
            "6.1B active, 4.8B non-embedding, as Ling-flash-2.0)",
        ),
        ModelPreset(
            "dMoE-16B",
            _DMOE,
            16e9,
            1.4e9,
            "FSCCS/dMoE-16B: LLaDA2.0-mini's config.json (fscdc/dMoE training config) with its gate's mode "
            "'aggregate' and core_threshold 0.6; totals as LLaDA2.0-mini's",
        ),
        ModelPreset(
            "DiffusionGemma-26B-A4B",
            _DIFFUSION_GEMMA,
            25.2e9,
            3.8e9,
            "google/diffusiongemma-26B-A4B-it config.json as quoted by public parsers (mlxcel, a C# loader, a "
            "packer), matching SGLang's cookbook, vLLM's recipe and the card; totals from the card / cookbook "
            "(25.2B total, 3.8B active; the name rounds to 26B / 4B)",
            # SGLang's renoise sampler stops a 256-token canvas after at most 48 steps: TPF >= 256/48.
            default_tpf=256 / 48,
        ),
    )
}


def find_preset(name: str) -> ModelPreset | None:
    wanted = name.lower().replace("_", "-")
    for preset_name, preset in MODEL_PRESETS.items():
        if preset_name.lower() == wanted:
            return preset
    return None


def load_model(name_or_path: str) -> tuple[ModelSpec, ModelPreset | None]:
    """A preset name, a model directory holding config.json, or a config.json path -> (spec, preset or None)."""
    preset = find_preset(name_or_path)
    if preset is not None:
        return spec_from_config(preset.config, preset.name), preset
    path = Path(name_or_path)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ValueError(
            f"model: {name_or_path!r} is neither a preset ({', '.join(MODEL_PRESETS)}) nor a model directory "
            "or config.json path"
        )
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model: {config_path} is not valid JSON ({e})") from e
    name = path.name if path.is_dir() else path.parent.name or config_path.stem
    return spec_from_config(config, name), None
