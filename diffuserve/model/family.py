"""ModelFamily: the record a model family gives the registry (how its checkpoint parses, builds, loads and lays out
its caches). Knows no family: each fills one in its own `model/families/<name>/family.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from diffuserve.model.config import ModelArgs
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.known_settings import NO_SETTINGS, FamilySettings
from diffuserve.model.shapes import CacheLayout, attention_layout
from diffuserve.model.weight_names import WeightTarget

ParallelDim = tuple[str, int, bool]
"""(what the config calls it, its size, whether ranks may replicate it instead of splitting it)."""


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
    """The family's reference decoding knobs (SamplingParams names, and sampling_defaults.STEPS_CAPPED_BY_MAX_TOKENS);
    generation_config.json overrides them."""
    checkpoint_args: Callable[[ModelArgs, Path], ModelArgs] | None = None
    """(args, model directory) -> args refined by the checkpoint itself (e.g. which optional tensors it has)."""
    cache_layout: Callable[[ModelArgs, str], CacheLayout] = lambda args, dtype: attention_layout(
        args.num_layers, args.num_kv_heads, args.head_dim, dtype
    )
    """(args, cache dtype name) -> the cache each layer needs (model/shapes.py); default: every layer full
    attention."""
    generation_defaults: Callable[[dict], dict[str, Any]] | None = None
    """(generation_config.json) -> request defaults under SamplingParams names, for a family whose file spells its
    knobs its own way (None: the file's keys that are SamplingParams names, engine_setup.GENERATION_KEYS)."""
    parallel_dims: Callable[[ModelArgs], list[ParallelDim]] | None = None
    """The family's own dimensions tensor parallelism splits, beyond attention heads and MLP / expert widths."""
    settings: FamilySettings = NO_SETTINGS
    """The config.json keys its parser reads or knows to be irrelevant (every other one is reported at load)."""
    tensor_parallel: bool = True
    """Its layers know their tensor-parallel packing (`shard_`); False: refused above one rank."""
    kv_heads_replicable: bool = False
    """Its attention replicates K/V heads when the ranks outnumber them (else they must divide evenly)."""
