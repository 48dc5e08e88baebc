"""The clover_moe family's record: Clover-35B-A3B-Preview and its Qwen3.5/3.6-MoE base (hybrid GDN / gated
attention); see model.py."""

from __future__ import annotations

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import cache_layout, clover_moe_args_from_hf, hybrid_args
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.model.families.clover_moe.settings import SETTINGS
from diffuserve.model.families.clover_moe.weights import (
    clover_moe_checkpoint_args,
    clover_moe_checkpoint_tensors,
    clover_moe_weight_target,
)
from diffuserve.model.family import ModelFamily, ParallelDim


def gdn_parallel_dims(args: ModelArgs) -> list[ParallelDim]:
    """The Gated DeltaNet heads tensor parallelism splits (a K head's V heads stay on one rank)."""
    gdn = hybrid_args(args).gdn
    return [
        ("linear-attention key heads (linear_num_key_heads)", gdn.num_key_heads, False),
        ("linear-attention value heads (linear_num_value_heads)", gdn.num_value_heads, False),
    ]


FAMILY = ModelFamily(
    "clover_moe",
    CloverMoeForBlockDiffusion,
    clover_moe_args_from_hf,
    clover_moe_weight_target,
    clover_moe_checkpoint_tensors,
    checkpoint_args=clover_moe_checkpoint_args,
    cache_layout=cache_layout,
    parallel_dims=gdn_parallel_dims,
    kv_heads_replicable=True,
    settings=SETTINGS,
)
