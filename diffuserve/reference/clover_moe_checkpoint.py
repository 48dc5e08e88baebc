"""Writes random-weight `clover_moe` checkpoint directories (config.json, safetensors, byte-level tokenizer,
generation_config.json) for tests and benchmarks; weights cannot be downloaded where this project is built.

Named shapes: `clover-moe-bench` has the real layer pattern at small width (8 layers = 6 GDN + 2 gated
attention, hidden 512, 16 experts top-2 + a shared expert, vocab 8192, 32-token blocks); `clover-moe-tiny` is
the test shape. Layouts: fused or per-expert experts, `model.` or the Hub's multimodal `model.language_model.`
prefix, one file or shards, fp32 or bf16, with or without the four block-diffusion tensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, text_fields, with_diffusion
from diffuserve.model.families.clover_moe.family import FAMILY as CLOVER_MOE
from diffuserve.model.families.clover_moe.weights import clover_moe_checkpoint_tensors
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer

CLOVER_MOE_PRESETS: dict[str, dict[str, Any]] = {
    "clover-moe-bench": dict(
        hidden_size=512,
        num_hidden_layers=8,
        full_attention_interval=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        partial_rotary_factor=0.25,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=16,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        vocab_size=8192,
        block_length=32,
        max_position_embeddings=4096,
    ),
    "clover-moe-tiny": dict(
        hidden_size=64,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        vocab_size=320,
        block_length=4,
        max_position_embeddings=1024,
    ),
}


def make_clover_moe_config(preset: str = "clover-moe-tiny", **overrides: Any) -> dict:
    """A complete config.json dict for a preset; `overrides` replace or add fields."""
    if preset not in CLOVER_MOE_PRESETS:
        raise ValueError(f"preset: {preset!r} is unknown; available: {', '.join(CLOVER_MOE_PRESETS)}")
    config: dict[str, Any] = dict(
        architectures=["CloverMoeModelLM"],
        model_type="clover_moe",
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        torch_dtype="float32",
    )
    return {**config, **CLOVER_MOE_PRESETS[preset], **overrides}


def write_clover_moe_checkpoint(
    out_dir: str | Path,
    config: dict,
    seed: int = 0,
    init_std: float = 0.02,
    logit_scale: float = 1.0,
    diffusion: bool = True,
    per_expert: bool = False,
    prefix: str = "model.",
    max_shard_bytes: int | None = None,
) -> Path:
    """Writes a checkpoint directory with seeded random weights (see `random_state`). Returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = write_byte_tokenizer(out, text_fields(config)["vocab_size"])
    config = {"mask_token_id": specials["<|MASK|>"], "eos_token_id": specials["<|endoftext|>"], **config}
    args = with_diffusion(clover_moe_args_from_hf(config), diffusion)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.torch_dtype or "float32"]
    state = {name: t.to(dtype) for name, t in random_state(args, seed, init_std, logit_scale).items()}
    tensors = dict(clover_moe_checkpoint_tensors(state, args, per_expert, prefix))
    save_sharded({name: t.contiguous() for name, t in tensors.items()}, out, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"eos_token_id": [specials["<|im_end|>"], specials["<|endoftext|>"]]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out


def random_state(args: Any, seed: int, init_std: float, logit_scale: float) -> dict[str, torch.Tensor]:
    """Seeded fp32 weights: normal(0, init_std), except where the model needs a range to be sane: the GDN output
    norm around 1 (the zero-centred norms around 0), A_log = log(uniform(1, 16)), dt_bias around 1, the
    softmax logit scale in [2, 6] and the LM head times `logit_scale`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = CLOVER_MOE.model_cls(args, 1)
    state = {}
    for name, param in model.state_dict().items():
        value = torch.randn(param.shape, generator=generator) * init_std
        if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
            value = 1.0 + value
        elif name.endswith("A_log"):
            value = torch.empty(param.shape).uniform_(1.0, 16.0, generator=generator).log()
        elif name.endswith("bd_softmax_logit_scale"):
            value = torch.empty(param.shape).uniform_(2.0, 6.0, generator=generator)
        elif name == "lm_head.weight":
            value = value * logit_scale
        state[name] = value
    return state


def save_sharded(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int | None) -> None:
    """model.safetensors, or shards of at most `max_shard_bytes` (a tensor is never split) and their index."""
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    if max_shard_bytes is None or sum(sizes.values()) <= max_shard_bytes:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        if shards[-1] and used + sizes[name] > max_shard_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += sizes[name]
    weight_map, width = {}, max(5, int(math.log10(len(shards))) + 1)
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:0{width}d}-of-{len(shards):0{width}d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
