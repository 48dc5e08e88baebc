"""Putting quantized modules into a built model, before its parameters are allocated:

    build on meta -> apply_tp (shards) -> quantize_modules_ (QuantLinear / QuantFusedExperts of the local shapes)
    -> materialize -> load (quantized on the way, or pre-quantized parts) -> finalize_ (kernel layouts)

Which weights become quantized, in which format, is the caller's `format_for(param name)`: the on-load scheme's
targets, or what a pre-quantized checkpoint holds. Also the `dummy` load format's quantized weights: seeded random
rows quantized as they are made. Knows nothing of checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from diffuserve.model.layers.linear import RowParallelLinear
from diffuserve.model.layers.moe.layer import FusedExperts
from diffuserve.model.quant.experts import QuantFusedExperts
from diffuserve.model.quant.formats import QuantFormat, Region
from diffuserve.model.quant.linear import QuantLinear
from diffuserve.model.quant.weight import CHUNK_ELEMENTS, QuantWeight

FormatFor = Callable[[str], "QuantFormat | None"]
logger = logging.getLogger(__name__)


def check_width(fmt: QuantFormat, shape: tuple[int, ...], name: str) -> None:
    """int4 needs an even input width that its groups divide (errors name the weight and the fix)."""
    k = shape[-1]
    if fmt.method == "int4" and (k % 2 or (fmt.group_size is not None and k % fmt.group_size)):
        raise ValueError(
            f"quantization_group_size: {fmt.group_size} does not divide the input width {k} of {name}; pick a "
            "group size that divides it, or leave its kind out of --quantization-targets"
        )


def _replacement(name: str, module: nn.Module, format_for: FormatFor, scale_dtype: torch.dtype) -> nn.Module | None:
    if isinstance(module, (nn.Linear, RowParallelLinear)):
        fmt = format_for(f"{name}.weight")
        if fmt is None:
            return None
        check_width(fmt, tuple(module.weight.shape), name)
        return QuantLinear.replacing(module, fmt, scale_dtype)
    if isinstance(module, FusedExperts):
        gate_up, down = format_for(f"{name}.gate_up_proj"), format_for(f"{name}.down_proj")
        if gate_up is None and down is None:
            return None
        if gate_up is None or down is None:
            raise ValueError(f"checkpoint: {name} has only one of gate_up_proj / down_proj quantized")
        check_width(gate_up, tuple(module.gate_up_proj.shape), f"{name}.gate_up_proj")
        check_width(down, tuple(module.down_proj.shape), f"{name}.down_proj")
        return QuantFusedExperts(module, (gate_up, down), scale_dtype)
    return None


def quantize_modules_(model: nn.Module, format_for: FormatFor, scale_dtype: torch.dtype) -> int:
    """Replaces every layer whose weight `format_for` names by its quantized counterpart; returns how many.
    A head tied to the embeddings stays as it is (the embedding lookup needs the 16-bit table)."""
    tied = {id(p) for name, m in model.named_modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    count = 0
    for name, module in list(model.named_modules()):
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) and weight is not None and id(weight) in tied:
            logger.info("%s is tied to the embeddings: left unquantized", name)
            continue
        new = _replacement(name, module, format_for, scale_dtype)
        if new is None:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)
        count += 1
    return count


def quant_weights(model: nn.Module) -> dict[str, QuantWeight]:
    """{logical weight name (`...qkv_proj.weight`, `...experts.gate_up_proj`): its QuantWeight}."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantWeight)}


def finalize_(model: nn.Module, dtype: torch.dtype) -> None:
    """Every quantized weight into its kernel's layout (see QuantWeight.finalize); `dtype`: the activations'."""
    for weight in quant_weights(model).values():
        weight.finalize(dtype)


@torch.no_grad()
def fill_dummy_(model: nn.Module, seed: int, std: float) -> None:
    """Seeded normal(0, std) weights, quantized a chunk of rows at a time (never a full 16-bit copy)."""
    for index, (name, weight) in enumerate(quant_weights(model).items()):
        generator = torch.Generator(device=weight.qdata.device).manual_seed(seed + 7919 * (index + 1))
        *lead, n, k = weight.shape
        step = max(1, CHUNK_ELEMENTS // k)
        for e in range(lead[0] if lead else 1):
            for start in range(0, n, step):
                rows = min(step, n - start)
                values = torch.empty(rows, k, device=weight.qdata.device).normal_(0.0, std, generator=generator)
                box = Region(slice(e, e + 1) if lead else None, (start, rows), (0, k))
                weight.write_float(box, values[None] if lead else values, (0, k), name)
