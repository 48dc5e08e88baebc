"""Writes random-weight DiffusionGemma checkpoint directories in transformers' layout (config.json with the
published field spellings, safetensors under transformers' names, generation_config.json, a byte-level
tokenizer) without transformers; weights cannot be downloaded where this project is built.

Named shapes: `diffusiongemma-bench` keeps the published layer pattern and canvas at small width (12 layers =
two 5 : 1 groups, hidden 512, sliding 4 KV heads x 64 with window 512, full 1 KV head x 128 with K = V, dense
GeGLU 512 beside 16 experts top-4 of width 128, vocab 8192, canvas 256); `diffusiongemma-tiny` is a test shape.
Seeded weights: normal(0, init_std), norm weights around 1, layer and router scales 1, the final norm times
`logit_scale` (it scales the logits and nothing else) and the self-conditioning output projection times
`feedback` (see reference/diffusion_gemma_hf.py for why tests damp it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from diffuserve.model.families.diffusion_gemma.config import diffusion_gemma_args_from_hf
from diffuserve.model.families.diffusion_gemma.family import FAMILY as DIFFUSION_GEMMA
from diffuserve.model.families.diffusion_gemma.weights import diffusion_gemma_checkpoint_tensors
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer
from diffuserve.reference.clover_moe_checkpoint import save_sharded

DIFFUSION_GEMMA_PRESETS: dict[str, dict[str, Any]] = {
    "diffusiongemma-bench": dict(
        canvas_length=256,
        text_config=dict(
            hidden_size=512,
            num_hidden_layers=12,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            global_head_dim=128,
            num_global_key_value_heads=1,
            sliding_window=512,
            intermediate_size=512,
            num_experts=16,
            top_k_experts=4,
            moe_intermediate_size=128,
            vocab_size=8192,
            max_position_embeddings=8192,
        ),
    ),
    "diffusiongemma-tiny": dict(
        canvas_length=16,
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            global_head_dim=16,
            num_global_key_value_heads=1,
            sliding_window=8,
            intermediate_size=48,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=16,
            vocab_size=320,
            max_position_embeddings=1024,
        ),
    ),
}
TINY_VISION = dict(
    model_type="gemma4_vision",
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
)
"""transformers always builds a vision tower; this one is tiny (its weights are not written: transformers
initialises them, we never run them)."""


def make_diffusion_gemma_config(preset: str = "diffusiongemma-tiny", **text_overrides: Any) -> dict:
    """A complete config.json dict for a preset; `text_overrides` replace or add text_config fields."""
    if preset not in DIFFUSION_GEMMA_PRESETS:
        raise ValueError(f"preset: {preset!r} is unknown; available: {', '.join(DIFFUSION_GEMMA_PRESETS)}")
    shape = DIFFUSION_GEMMA_PRESETS[preset]
    text = dict(
        model_type="diffusion_gemma_text",
        rms_norm_eps=1e-6,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        dtype="float32",
        **shape["text_config"],
    )
    return dict(
        architectures=["DiffusionGemmaForBlockDiffusion"],
        model_type="diffusion_gemma",
        canvas_length=shape["canvas_length"],
        tie_word_embeddings=True,
        text_config={**text, **text_overrides},
        vision_config=TINY_VISION,
    )


def random_state(args: Any, seed: int, init_std: float, logit_scale: float, feedback: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = DIFFUSION_GEMMA.model_cls(args, 1)
    state = {}
    for name, param in model.state_dict().items():
        if name.endswith(("layer_scalar", ".scale", "per_expert_scale")):
            state[name] = torch.ones(param.shape)
            continue
        noise = torch.randn(param.shape, generator=generator)
        value = 1.0 + 0.3 * noise if name.endswith("norm.weight") else init_std * noise
        if name == "model.norm.weight":
            value = value * logit_scale
        elif name == "model.self_conditioning.mlp.down_proj.weight":
            value = value * feedback
        state[name] = value
    return state


def write_diffusion_gemma_checkpoint(
    out_dir: str | Path,
    config: dict,
    seed: int = 0,
    init_std: float = 0.05,
    logit_scale: float = 8.0,
    feedback: float = 1.0,
) -> Path:
    """Writes the checkpoint directory (module docstring). Returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = write_byte_tokenizer(out, config["text_config"]["vocab_size"])
    eos = [specials["<|im_end|>"], specials["<|endoftext|>"]]
    config = {**config, "text_config": {"eos_token_id": eos[1], "pad_token_id": 0, **config["text_config"]}}
    args = diffusion_gemma_args_from_hf(config)
    state = random_state(args, seed, init_std, logit_scale, feedback)
    tensors = {name: t.contiguous() for name, t in diffusion_gemma_checkpoint_tensors(state, args)}
    save_sharded(tensors, out, None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = dict(
        eos_token_id=eos,
        pad_token_id=0,
        max_new_tokens=256,
        max_denoising_steps=48,
        sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
    )
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out
