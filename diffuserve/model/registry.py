"""Architecture name (config.json `architectures[0]`) -> model family. A dict, not a plugin system."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from diffuserve.model.clover_moe import CloverMoeForBlockDiffusion
from diffuserve.model.clover_moe_config import cache_layout as clover_moe_cache_layout
from diffuserve.model.clover_moe_config import clover_moe_args_from_hf
from diffuserve.model.clover_moe_weights import (
    clover_moe_checkpoint_args,
    clover_moe_checkpoint_tensors,
    clover_moe_weight_target,
)
from diffuserve.model.config import ModelArgs, llada2_args_from_hf, qwen3_args_from_hf
from diffuserve.model.diffusion_gemma import DiffusionGemmaForBlockDiffusion
from diffuserve.model.diffusion_gemma_config import cache_layout as diffusion_gemma_cache_layout
from diffuserve.model.diffusion_gemma_config import diffusion_gemma_args_from_hf
from diffuserve.model.diffusion_gemma_config import generation_defaults as diffusion_gemma_generation_defaults
from diffuserve.model.diffusion_gemma_weights import diffusion_gemma_checkpoint_tensors, diffusion_gemma_weight_target
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.llada2 import LLaDA2ForBlockDiffusion
from diffuserve.model.llada2_weights import llada2_checkpoint_tensors, llada2_weight_target
from diffuserve.model.sdar import SDARForBlockDiffusion
from diffuserve.model.shapes import CacheLayout, attention_layout
from diffuserve.model.weight_names import WeightTarget, qwen3_checkpoint_tensors, qwen3_weight_target


class CheckpointTensors(Protocol):
    def __call__(
        self, state: dict[str, torch.Tensor], args: ModelArgs, per_expert: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Our state dict -> checkpoint tensors with Hub names; `per_expert=False` keeps the fused expert tensors
        (`experts.gate_up_proj`, `experts.down_proj`) instead of one tensor per expert."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_cls: Callable[[ModelArgs, int], DiffusionModel]
    """(args, max_model_len) -> the model (its parameters uninitialised; see loader.build_model)."""
    parse_args: Callable[[dict, dict], ModelArgs]
    """(config.json, generation_config.json) -> ModelArgs."""
    weight_target: Callable[[str, ModelArgs], WeightTarget | None]
    """Checkpoint tensor name -> where it loads (None: ignore)."""
    checkpoint_tensors: CheckpointTensors
    """Our state dict -> checkpoint tensors with Hub names (for writing checkpoints)."""
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    """config field -> token text, for ids the family's Hub config.json leaves out (looked up in tokenizer.json)."""
    decoding_defaults: Mapping[str, Any] = field(default_factory=dict)
    """The family's reference decoding knobs (SamplingParams names); generation_config.json overrides them."""
    checkpoint_args: Callable[[ModelArgs, Path], ModelArgs] | None = None
    """(args, model directory) -> args refined by the checkpoint itself (e.g. which optional tensors it has)."""
    cache_layout: Callable[[ModelArgs, str], CacheLayout] = lambda args, dtype: attention_layout(
        args.num_layers, args.num_kv_heads, args.head_dim, dtype
    )
    """(args, cache dtype name) -> the cache each layer needs (model/shapes.py); default: every layer full
    attention."""
    steps_capped_by_max_tokens: bool = False
    """The reference caps a request's denoising steps per block at its max_tokens (LLaDA2's `generate`: `steps =
    min(steps, gen_length // minimal_topk)`, minimal_topk 1), so an answer shorter than a block accepts more
    tokens per step."""
    generation_defaults: Callable[[dict], dict[str, Any]] | None = None
    """(generation_config.json) -> request defaults under SamplingParams names, for a family whose file spells its
    knobs its own way (None: the file's keys that are SamplingParams names, engine_setup.GENERATION_KEYS)."""


SDAR = ModelFamily("sdar", SDARForBlockDiffusion, qwen3_args_from_hf, qwen3_weight_target, qwen3_checkpoint_tensors)

# LLaDA2.0 and LLaDA2.1 share architecture name and config; 2.1 differs only in decoding (decoder="edit").
LLADA2 = ModelFamily(
    "llada2",
    LLaDA2ForBlockDiffusion,
    llada2_args_from_hf,
    llada2_weight_target,
    llada2_checkpoint_tensors,
    special_tokens={"mask_token_id": "<|mask|>", "eos_token_id": "<|endoftext|>"},
    decoding_defaults={"decoder": "threshold", "threshold": 0.95, "temperature": 0.0},
    steps_capped_by_max_tokens=True,
)

# Clover-35B-A3B-Preview and its Qwen3.5/3.6-MoE base (hybrid GDN / gated attention); see clover_moe.py.
CLOVER_MOE = ModelFamily(
    "clover_moe",
    CloverMoeForBlockDiffusion,
    clover_moe_args_from_hf,
    clover_moe_weight_target,
    clover_moe_checkpoint_tensors,
    checkpoint_args=clover_moe_checkpoint_args,
    cache_layout=clover_moe_cache_layout,
)

# DiffusionGemma-26B-A4B (transformers' `DiffusionGemmaForBlockDiffusion`); see diffusion_gemma.py.
DIFFUSION_GEMMA = ModelFamily(
    "diffusion_gemma",
    DiffusionGemmaForBlockDiffusion,
    diffusion_gemma_args_from_hf,
    diffusion_gemma_weight_target,
    diffusion_gemma_checkpoint_tensors,
    cache_layout=diffusion_gemma_cache_layout,
    generation_defaults=diffusion_gemma_generation_defaults,
)

ARCHITECTURES: dict[str, ModelFamily] = {
    "SDARForCausalLM": SDAR,
    "SDARMoeForCausalLM": SDAR,
    # Plain Qwen3 checkpoints load too once their config names the diffusion fields (mask_token_id, block_length).
    "Qwen3ForCausalLM": SDAR,
    "Qwen3MoeForCausalLM": SDAR,
    "LLaDA2MoeModelLM": LLADA2,
    "CloverMoeModelLM": CLOVER_MOE,
    "DiffusionGemmaForBlockDiffusion": DIFFUSION_GEMMA,
    # The base model's text trunk: runs autoregressively (no block-diffusion tensors).
    "Qwen3_5MoeForCausalLM": CLOVER_MOE,
    "Qwen3_5MoeForConditionalGeneration": CLOVER_MOE,
    # The sdar family's old name, from before Clover was published (see deprecation_notice).
    "CloverForBlockDiffusion": SDAR,
}
DEPRECATED_ARCHITECTURES = frozenset({"CloverForBlockDiffusion"})
SUPPORTED = ", ".join(name for name in ARCHITECTURES if name not in DEPRECATED_ARCHITECTURES)


def sdar_names(config: dict) -> tuple[str, str]:
    """(architecture, model_type) that an sdar-family config.json names: MoE when it has experts, else dense."""
    if int(config.get("num_experts") or config.get("num_local_experts") or 0) > 0:
        return "SDARMoeForCausalLM", "sdar_moe"
    return "SDARForCausalLM", "sdar"


def deprecation_notice(config: dict) -> str | None:
    """One line telling what to put in config.json instead of a deprecated architecture name; None if current."""
    archs = config.get("architectures") or []
    if not archs or archs[0] not in DEPRECATED_ARCHITECTURES:
        return None
    arch, model_type = sdar_names(config)
    return (
        f"config.json: architecture {archs[0]!r} is deprecated (it is the SDAR-shaped family, not Clover, which "
        f'is \'CloverMoeModelLM\'); it loads as before, but set "architectures": ["{arch}"] and '
        f'"model_type": "{model_type}"'
    )


def family_for(config: dict) -> ModelFamily:
    archs = config.get("architectures") or []
    if not archs:
        raise ValueError("config.json: missing `architectures`; expected one of " + SUPPORTED)
    if archs[0] not in ARCHITECTURES and config.get("auto_map"):
        remote = next(iter(config["auto_map"].values()))
        raise ValueError(
            f"config.json: architecture {archs[0]!r} is defined by remote code ({remote!r} via auto_map), which "
            f"diffuserve does not run (no trust_remote_code); supported: {SUPPORTED}"
        )
    if archs[0] not in ARCHITECTURES:
        raise ValueError(f"config.json: architecture {archs[0]!r} is not supported; supported: {SUPPORTED}")
    return ARCHITECTURES[archs[0]]


def cache_layout(args: ModelArgs, dtype: str) -> CacheLayout:
    """The cache layout of a model of `args` (its family's) with caches in `dtype`."""
    family = ARCHITECTURES.get(args.architecture, SDAR)
    return family.cache_layout(args, dtype)
