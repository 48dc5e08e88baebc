"""Splitting a model across tensor- / expert-parallel ranks (gpt-fast's `apply_tp` idea): the family files stay
single-process; after building a model (on the meta device), `apply_tp` asks every shardable layer to keep its
own part, and `check_parallel_sizes` refuses sizes that don't divide the model's heads, widths or experts.

Attention, dense MLPs and MoE blocks know their own packing (`shard_`); a MoE block also decides for its shared
expert, so modules inside a MoE block are left to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.moe.layer import SparseMoeBlock

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


@runtime_checkable
class Shardable(Protocol):
    """A layer that knows its own packing: `shard_` replaces its parameters by this rank's part."""

    def shard_(self, group: ParallelGroup) -> None: ...


def check_parallel_sizes(args: ModelArgs, size: int, expert_parallel: bool) -> None:
    """Raises ValueError naming the first model dimension that `size` ranks cannot split evenly."""
    if "hybrid" in args.extra:
        raise ValueError(
            f"tensor_parallel_size: {size} is not supported for models with recurrent layers (clover_moe) yet; use 1"
        )
    if expert_parallel and not args.is_moe:
        raise ValueError("enable_expert_parallel: the model has no experts; drop --enable-expert-parallel")
    dims = [
        ("attention heads (num_attention_heads)", args.num_heads),
        ("KV heads (num_key_value_heads)", args.num_kv_heads),
    ]
    if len(args.dense_layer_ids) and args.intermediate_size:
        dims.append(("dense MLP width (intermediate_size)", args.intermediate_size))
    if args.is_moe and expert_parallel:
        dims.append(("experts (num_experts)", args.num_experts))
    elif args.is_moe:
        dims.append(("expert width (moe_intermediate_size)", args.moe_intermediate_size))
        if args.shared_expert_intermediate_size:
            dims.append(("shared expert width", args.shared_expert_intermediate_size))
    for name, value in dims:
        if value % size:
            fits = [d for d in range(1, value + 1) if all(v % d == 0 for _, v in dims)]
            raise ValueError(
                f"tensor_parallel_size: {size} does not divide the model's {value} {name}; "
                f"use one of {', '.join(map(str, fits))}"
            )


def apply_tp(model: nn.Module, group: ParallelGroup) -> None:
    """Replaces every shardable layer's parameters by this rank's part (uninitialised, tagged for the loader)."""
    inside_moe = {
        id(m)
        for block in model.modules()
        if isinstance(block, SparseMoeBlock)
        for m in block.modules()
        if m is not block
    }
    for module in list(model.modules()):
        if id(module) not in inside_moe and isinstance(module, Shardable):
            module.shard_(group)
