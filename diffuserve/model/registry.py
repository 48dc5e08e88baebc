"""Architecture name (config.json `architectures[0]`) -> model family, by name: a family's modules are imported
only when a checkpoint names it (`load_family`), so loading an SDAR checkpoint imports no other family. A dict,
not a plugin system; adding a family adds its folder under model/families/ and a line here.
"""

from __future__ import annotations

import importlib

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.shapes import CacheLayout

ARCHITECTURES: dict[str, str] = {
    "SDARForCausalLM": "sdar",
    "SDARMoeForCausalLM": "sdar",
    # Plain Qwen3 checkpoints load too once their config names the diffusion fields (mask_token_id, block_length).
    "Qwen3ForCausalLM": "sdar",
    "Qwen3MoeForCausalLM": "sdar",
    "LLaDA2MoeModelLM": "llada2",
    "CloverMoeModelLM": "clover_moe",
    "DiffusionGemmaForBlockDiffusion": "diffusion_gemma",
    # The base model's text trunk: runs autoregressively (no block-diffusion tensors).
    "Qwen3_5MoeForCausalLM": "clover_moe",
    "Qwen3_5MoeForConditionalGeneration": "clover_moe",
    # The sdar family's old name, from before Clover was published (see deprecation_notice).
    "CloverForBlockDiffusion": "sdar",
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
    return load_family(ARCHITECTURES[archs[0]])


def cache_layout(args: ModelArgs, dtype: str) -> CacheLayout:
    """The cache layout of a model of `args` (its family's) with caches in `dtype`."""
    return family_of(args).cache_layout(args, dtype)


def family_of(args: ModelArgs) -> ModelFamily:
    """The family of a model of `args` (sdar for args built without a checkpoint's architecture)."""
    return load_family(ARCHITECTURES.get(args.architecture, "sdar"))


def load_family(name: str) -> ModelFamily:
    """The family `name` (a folder of model/families/), imported now: loading one family imports no other."""
    module = importlib.import_module(f"diffuserve.model.families.{name}.family")
    return module.FAMILY
