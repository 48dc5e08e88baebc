"""Architecture name (config.json `architectures[0]`) -> model family. A dict, not a plugin system."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from diffuserve.model.clover import CloverForBlockDiffusion
from diffuserve.model.config import ModelArgs, qwen3_args_from_hf
from diffuserve.model.weight_names import WeightTarget, qwen3_checkpoint_tensors, qwen3_weight_target


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_cls: type[nn.Module]
    parse_args: Callable[[dict, dict], ModelArgs]
    """(config.json, generation_config.json) -> ModelArgs."""
    weight_target: Callable[[str, ModelArgs], WeightTarget | None]
    """Checkpoint tensor name -> where it loads (None: ignore)."""
    checkpoint_tensors: Callable[[dict[str, torch.Tensor], ModelArgs], Iterator[tuple[str, torch.Tensor]]]
    """Our state dict -> checkpoint tensors with Hub names (for writing checkpoints)."""


CLOVER = ModelFamily(
    "clover", CloverForBlockDiffusion, qwen3_args_from_hf, qwen3_weight_target, qwen3_checkpoint_tensors
)

ARCHITECTURES: dict[str, ModelFamily] = {
    "CloverForBlockDiffusion": CLOVER,
    "SDARForCausalLM": CLOVER,
    "SDARMoeForCausalLM": CLOVER,
    # Plain Qwen3 checkpoints load too once their config names the diffusion fields (mask_token_id, block_length).
    "Qwen3ForCausalLM": CLOVER,
    "Qwen3MoeForCausalLM": CLOVER,
}


def family_for(config: dict) -> ModelFamily:
    archs = config.get("architectures") or []
    if not archs:
        raise ValueError("config.json: missing `architectures`; expected one of " + ", ".join(ARCHITECTURES))
    if archs[0] not in ARCHITECTURES:
        raise ValueError(
            f"config.json: architecture {archs[0]!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[archs[0]]
