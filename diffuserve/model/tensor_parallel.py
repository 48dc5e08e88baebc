"""Splitting a model across tensor- / expert-parallel ranks (gpt-fast's `apply_tp` idea): the family files stay
single-process; after building a model (on the meta device), `apply_tp` asks every shardable layer to keep its
own part, and `check_parallel_sizes` refuses sizes that don't divide the model's heads, widths or experts.

Attention (plain and gated), Gated DeltaNet, dense MLPs and MoE blocks know their own packing (`shard_`); a MoE
block also decides for its shared expert, so modules inside a MoE block are left to it. Embeddings, norms,
routers and the LM head stay whole on every rank (rank 0 alone computes logits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily, ParallelDim
from diffuserve.model.layers.moe.layer import SparseMoeBlock
from diffuserve.model.registry import family_of

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


@runtime_checkable
class Shardable(Protocol):
    """A layer that knows its own packing: `shard_` replaces its parameters by this rank's part."""

    def shard_(self, group: ParallelGroup) -> None: ...


def check_parallel_sizes(args: ModelArgs, size: int, expert_parallel: bool) -> None:
    """Raises ValueError naming the first model dimension that `size` ranks cannot split evenly, and the sizes
    that split all of them."""
    if expert_parallel and not args.is_moe:
        raise ValueError("enable_expert_parallel: the model has no experts; drop --enable-expert-parallel")
    family = family_of(args)
    if size > 1 and not family.tensor_parallel:  # its layers have no `shard_`: each rank would keep them whole
        raise ValueError(
            f"tensor_parallel_size: {size} ranks cannot split {family.name} yet (its layers have no "
            "tensor-parallel packing); use 1"
        )
    dims = _parallel_dims(args, family, expert_parallel)
    for name, value, replicable in dims:
        if not _splits(value, size, replicable):
            largest = max(v for _, v, _ in dims)
            fits = [d for d in range(1, largest + 1) if all(_splits(v, d, r) for _, v, r in dims)]
            relation = "neither divides nor is a multiple of" if replicable else "does not divide"
            raise ValueError(
                f"tensor_parallel_size: {size} {relation} the model's {value} {name}; "
                f"use one of {', '.join(map(str, fits))}"
            )


def _splits(value: int, size: int, replicable: bool) -> bool:
    """`size` ranks split `value` heads evenly, or (replicable) hold one each, size / value ranks per head."""
    return value % size == 0 or (replicable and size % value == 0)


def _parallel_dims(args: ModelArgs, family: ModelFamily, expert_parallel: bool) -> list[ParallelDim]:
    """(name, size, replicable) of every dimension tensor / expert parallelism splits: the attention heads, the
    family's own (e.g. a hybrid model's linear-attention heads), the MLP and expert widths, or the experts."""
    dims = [
        ("attention heads (num_attention_heads)", args.num_heads, False),
        ("KV heads (num_key_value_heads)", args.num_kv_heads, family.kv_heads_replicable),
    ]
    if family.parallel_dims is not None:
        dims += family.parallel_dims(args)
    if len(args.dense_layer_ids) and args.intermediate_size:
        dims.append(("dense MLP width (intermediate_size)", args.intermediate_size, False))
    if args.is_moe and expert_parallel:
        dims.append(("experts (num_experts)", args.num_experts, False))
    elif args.is_moe:
        dims.append(("expert width (moe_intermediate_size)", args.moe_intermediate_size, False))
        if args.shared_expert_intermediate_size:
            dims.append(("shared expert width", args.shared_expert_intermediate_size, False))
    return dims


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
