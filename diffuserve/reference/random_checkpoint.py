"""Writes random-weight checkpoint directories (the sdar family: SDAR, SDAR-MoE) with a byte-level tokenizer, and the
safetensors of any model state under its family's Hub names (`save_weights`, also used by the trainer).

Used by tests, benchmarks and demos; weights cannot be downloaded on the machines this project is built on.
`sdar-moe-bench` is the shape every benchmark uses (about 60M parameters). The old preset names `clover-bench` and
`clover-tiny` (from before Clover meant the published model, see clover_moe_checkpoint.py) still work, with a
deprecation notice.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.registry import family_for, sdar_names
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer

logger = logging.getLogger(__name__)

PRESETS: dict[str, dict[str, Any]] = {
    "sdar-moe-bench": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        intermediate_size=1024,
        vocab_size=8192,
        block_length=32,
        max_position_embeddings=4096,
    ),
    "sdar-moe-tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=128,
        vocab_size=320,
        block_length=4,
        max_position_embeddings=1024,
    ),
}


DEPRECATED_PRESETS = {"clover-bench": "sdar-moe-bench", "clover-tiny": "sdar-moe-tiny"}
"""Old name -> current name of the shapes that were called `clover-*` before Clover meant the published model."""


def resolve_preset(preset: str) -> str:
    """The current name of a preset (an old name logs a one-line deprecation notice); unknown names are an error."""
    if preset in DEPRECATED_PRESETS:
        logger.warning(
            "preset: %r is deprecated (it is SDAR-MoE shaped, not Clover); use %r", preset, DEPRECATED_PRESETS[preset]
        )
        return DEPRECATED_PRESETS[preset]
    if preset not in PRESETS:
        raise ValueError(f"preset: {preset!r} is unknown; available: {', '.join(PRESETS)}")
    return preset


def make_config(preset: str = "sdar-moe-tiny", architecture: str | None = None, **overrides: Any) -> dict:
    """A complete config.json dict for a preset; `overrides` replace or add fields. The architecture defaults to
    `SDARMoeForCausalLM` (model_type `sdar_moe`), or `SDARForCausalLM` (`sdar`) when the overrides leave no experts."""
    preset = resolve_preset(preset)
    config: dict[str, Any] = dict(
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        attention_bias=False,
        torch_dtype="float32",
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    config.update(PRESETS[preset])
    config.update(overrides)
    default_arch, model_type = sdar_names(config)
    return {"architectures": [architecture or default_arch], "model_type": model_type, **config}


def write_random_checkpoint(
    out_dir: str | Path,
    config: dict,
    seed: int = 0,
    init_std: float = 0.02,
    logit_scale: float = 1.0,
    per_expert: bool = True,
    max_shard_bytes: int | None = None,
    generation: dict | None = None,
) -> Path:
    """Writes config, seeded random weights (normal(0, init_std); LM head scaled by `logit_scale` so that
    confidences spread out), tokenizer and generation_config. Returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = write_byte_tokenizer(out, config["vocab_size"])
    config = {"mask_token_id": specials["<|MASK|>"], "eos_token_id": specials["<|endoftext|>"], **config}
    family = family_for(config)
    write_random_weights(
        out,
        family,
        family.parse_args(config, {}),
        _dtype(config),
        seed,
        init_std,
        logit_scale,
        per_expert,
        max_shard_bytes,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"eos_token_id": [specials["<|im_end|>"], specials["<|endoftext|>"]], **(generation or {})}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out


def write_random_weights(
    out: Path,
    family: ModelFamily,
    args: ModelArgs,
    dtype: torch.dtype,
    seed: int = 0,
    init_std: float = 0.02,
    logit_scale: float = 1.0,
    per_expert: bool = True,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes the family's seeded random weights under their Hub names (sharded past `max_shard_bytes`): every
    tensor normal(0, init_std), norm weights 1 + that, the LM head times `logit_scale`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = family.model_cls(args, 1)
    state = {}
    for name, param in model.state_dict().items():
        value = torch.randn(param.shape, generator=generator) * init_std
        if name.endswith("norm.weight"):
            value = 1.0 + value
        if name == "lm_head.weight":
            value = value * logit_scale
        state[name] = value.to(dtype)
    save_weights(out, family, args, state, per_expert, max_shard_bytes)


def save_weights(
    out: Path,
    family: ModelFamily,
    args: ModelArgs,
    state: dict[str, torch.Tensor],
    per_expert: bool = True,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes a model's state dict as safetensors under the family's Hub names (sharded past `max_shard_bytes`)."""
    tensors = {name: t.detach().contiguous() for name, t in family.checkpoint_tensors(state, args, per_expert)}
    _save_sharded(tensors, out, max_shard_bytes)


def _dtype(config: dict) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config["torch_dtype"]]


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int | None) -> None:
    if max_shard_bytes is None:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
