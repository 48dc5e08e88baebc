"""The loader's side of quantized weights.

`quant_plan` decides, before the model is built, which weights are quantized and how: what a pre-quantized
checkpoint holds (its `quantization_config` and tensor names), or the `--quantization` scheme's targets for a
16/32-bit one; never both. `QuantLoader` then takes the checkpoint tensors that belong to quantized weights:

    a pre-quantized part     buffered until its weight's parts are all read (they may sit in different shards),
                             decoded to canonical parts, routed through the family's names and this rank's shard
    a 16/32-bit tensor       of a weight quantized on load: quantized a chunk of whole rows at a time, then
                             sharded (every rank stores the values a single process would)

so no 16-bit copy of a quantized weight exists beyond one checkpoint tensor (the shard being read) and one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.quant.apply import FormatFor, quant_weights
from diffuserve.model.quant.checkpoint_base import CheckpointQuant
from diffuserve.model.quant.checkpoint_config import checkpoint_quant
from diffuserve.model.quant.formats import QuantFormat, QuantParts, Region, slice_parts
from diffuserve.model.quant.quantize import on_load_format
from diffuserve.model.quant.scheme import QuantScheme
from diffuserve.model.weight_names import WeightTarget
from diffuserve.model.weight_pieces import Index, local_pieces


@dataclass(frozen=True)
class QuantPlan:
    format_for: FormatFor
    reader: CheckpointQuant | None
    """The pre-quantized checkpoint's reader; None when quantizing on load."""
    label: str


def quant_plan(
    config: dict, model_dir: str | Path, family: ModelFamily, args: ModelArgs, scheme: QuantScheme | None
) -> QuantPlan | None:
    """None for a 16/32-bit load."""
    reader = checkpoint_quant(config, model_dir)
    method = scheme.method if scheme is not None else None
    if reader is not None and method is not None:
        raise ValueError(
            f"quantization: {method} asked for, but the checkpoint is already quantized ({reader.label}); "
            "drop --quantization"
        )
    if reader is not None:
        formats = _checkpoint_formats(reader, family, args)
        return QuantPlan(formats.get, reader, reader.label)
    if scheme is None or method is None:
        return None
    fmt = on_load_format(method, scheme.group_size)
    targets = ", ".join(sorted(scheme.targets))
    return QuantPlan(lambda param: fmt if scheme.quantizes(param) else None, None, f"{fmt.describe()} of {targets}")


def _checkpoint_formats(reader: CheckpointQuant, family: ModelFamily, args: ModelArgs) -> dict[str, QuantFormat]:
    """{our parameter: format} for every quantized checkpoint weight we run (packed segments must agree)."""
    formats: dict[str, QuantFormat] = {}
    for base in sorted(reader.roles):
        target = family.weight_target(base, args)
        if target is None:
            continue
        fmt = reader.format_for(base)
        if formats.setdefault(target.param, fmt) != fmt:
            raise ValueError(f"checkpoint: {base} is {fmt.describe()}, other parts of {target.param} are not")
    return formats


def _region(index: Index) -> Region:
    rows, cols = index[-2], index[-1]
    lead = index[0] if len(index) == 3 else None
    return Region(lead, (rows.start, rows.stop - rows.start), (cols.start, cols.stop - cols.start))


class QuantLoader:
    def __init__(self, model: nn.Module, family: ModelFamily, args: ModelArgs, reader: CheckpointQuant | None):
        self.weights = quant_weights(model)
        self.family, self.args, self.reader = family, args, reader
        self.pending: dict[str, dict[str, torch.Tensor]] = {}
        self.part_names = {f"{name}.{p}" for name, w in self.weights.items() for p, _ in w.named_parameters()}
        """Parameters held by quantized weights (the float loader's coverage check leaves them out)."""

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """True if `name` is a part of a pre-quantized weight (then buffered, and written once complete)."""
        split = self.reader.role_of(name) if self.reader is not None else None
        if split is None:
            return False
        base, role = split
        received = self.pending.setdefault(base, {})
        received[role] = tensor
        if self.reader is not None and self.reader.is_complete(base, received):
            self._write_decoded(base, *self.reader.decode(base, self.pending.pop(base)))
        return True

    def write_float(self, target: WeightTarget, tensor: torch.Tensor, name: str) -> None:
        """A 16/32-bit checkpoint tensor of a weight quantized on load."""
        if self.reader is not None:
            raise ValueError(f"checkpoint: {name} is stored unquantized, but the rest of {target.param} is quantized")
        weight = self.weights[target.param]
        src = tensor.unsqueeze(0) if target.expert is not None else tensor
        for dst, index in local_pieces(weight.shape, weight.shard, target, tuple(tensor.shape), name):
            whole_rows = (*index[:-1], slice(None))  # quantized over their full width
            rows = src[whole_rows]
            cols = index[-1]
            weight.write_float(_region(dst), rows, (cols.start, cols.stop - cols.start), name)

    def _write_decoded(self, base: str, parts: QuantParts, shape: tuple[int, ...]) -> None:
        target = self.family.weight_target(base, self.args)
        if target is None:
            return
        weight = self.weights[target.param]
        if target.expert is not None:
            parts = QuantParts(*(None if p is None else p.unsqueeze(0) for p in parts))  # type: ignore[arg-type]
        aligned = (1, *shape) if target.expert is not None else shape
        for dst, index in local_pieces(weight.shape, weight.shard, target, shape, base):
            weight.write(_region(dst), slice_parts(weight.fmt, parts, _region(index), aligned, base), base)

    def check_complete(self, model_dir: str | Path) -> None:
        """Every quantized weight fully written, no part left waiting for the rest of its weight."""
        if self.pending:
            base, received = next(iter(self.pending.items()))
            assert self.reader is not None, "parts are pending only for a pre-quantized checkpoint"
            missing = sorted(self.reader.roles[base] - set(received))
            raise ValueError(f"checkpoint: {base} lacks its {', '.join(missing)} in {str(model_dir)!r}")
        missing = [name for name, weight in self.weights.items() if not weight.is_complete]
        if missing:
            raise ValueError(f"checkpoint: missing weights {', '.join(missing[:5])} in {str(model_dir)!r}")
