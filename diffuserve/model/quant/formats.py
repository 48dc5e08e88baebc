"""The canonical form of a quantized weight: what every source (quantize on load, an FP8 / GPTQ / AWQ /
compressed-tensors checkpoint) decodes to and what every kernel prepares its own layout from.

A logical weight W [*lead, N, K] (lead: the experts dimension of fused experts, else none; N output rows, K input
columns) is held as `QuantParts`:

    qdata  [*lead, N, K / pack]    int8 (int8), uint8 with two 4-bit values per byte, even column in the low
                                   nibble (int4), float8_e4m3fn (fp8)
    scale  [*lead, R, G]           R = ceil(N / row_block) row blocks, G = ceil(K / group_size) groups (1 when
                                   the scale spans the whole row: per output channel)
    zero   [*lead, N, G] or None   int4 only: the integer zero point (0..15) of each group, in the scale's dtype

and dequantizes as  W[n, k] = (q[n, k] - zero[n, k // g]) * scale[n // row_block, k // g]; without a `zero`
the zero point is 0 (int8, fp8) or 8 (symmetric int4: its stored nibbles are unsigned). Every part is row-local
except for `row_block` > 1 (128 x 128 FP8 blocks), so a shard of rows or columns is a slice of each part (see
`slice_parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

QDTYPES = {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value."""


@dataclass(frozen=True)
class QuantFormat:
    method: str
    """int8, int4 or fp8."""
    group_size: int | None = None
    """Input columns per scale; None: one scale per output row (per channel)."""
    row_block: int = 1
    """Output rows sharing a scale (1, or 128 for the Qwen / DeepSeek FP8 128 x 128 blocks)."""
    symmetric: bool = True
    """int4: False stores an integer zero point per group (asymmetric)."""

    @property
    def pack(self) -> int:
        """Values per qdata element along K."""
        return 2 if self.method == "int4" else 1

    def groups(self, k: int) -> int:
        return 1 if self.group_size is None else -(-k // self.group_size)

    def describe(self) -> str:
        group = "per channel" if self.group_size is None else f"groups of {self.group_size}"
        block = f", {self.row_block} x {self.group_size} blocks" if self.row_block > 1 else ""
        zeros = "" if self.symmetric else ", asymmetric"
        return f"{self.method} ({group}{block}{zeros})"


class QuantParts(NamedTuple):
    qdata: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None


def part_shapes(fmt: QuantFormat, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Shapes of the parts of a logical weight of `shape` [*lead, N, K]."""
    *lead, n, k = shape
    groups = fmt.groups(k)
    shapes = {"qdata": (*lead, n, k // fmt.pack), "scale": (*lead, -(-n // fmt.row_block), groups)}
    if not fmt.symmetric:
        shapes["zero"] = (*lead, n, groups)
    return shapes


@dataclass(frozen=True)
class Region:
    """A box of a logical weight: `lead` (a slice of the experts, or None), rows and columns (start, length)."""

    lead: slice | None
    rows: tuple[int, int]
    cols: tuple[int, int]


def _divided(fmt_name: str, start: int, length: int, unit: int, whole: int) -> slice:
    """[start, start + length) in units of `unit` (the tail may be partial only where the range ends the weight)."""
    if start % unit or (length % unit and start + length != whole):
        raise ValueError(
            f"quantization: {fmt_name} fills [{start}, {start + length}) of its weight, which splits a block of "
            f"{unit} (a packing such as q | k | v, or this tensor-parallel size, puts a boundary inside one); use "
            f"a tensor-parallel size that keeps every part a multiple of {unit}"
        )
    return slice(start // unit, -(-(start + length) // unit))


def slice_parts(fmt: QuantFormat, parts: QuantParts, box: Region, shape: tuple[int, ...], name: str) -> QuantParts:
    """The parts of logical box `box` of a weight of `shape` (errors name `name` when a box splits a block)."""
    index = region_index(fmt, box, shape, name)
    zero = None if parts.zero is None else parts.zero[index["zero"]]
    return QuantParts(parts.qdata[index["qdata"]], parts.scale[index["scale"]], zero)


def region_index(fmt: QuantFormat, box: Region, shape: tuple[int, ...], name: str) -> dict[str, tuple[slice, ...]]:
    """Index of each stored part (`part_shapes` names) that box `box` of the logical weight covers."""
    n, k = shape[-2:]
    lead = (box.lead,) if box.lead is not None else ()
    rows = slice(box.rows[0], box.rows[0] + box.rows[1])
    groups = slice(0, 1) if fmt.group_size is None else _divided(name, *box.cols, fmt.group_size, k)
    index = {
        "qdata": (*lead, rows, _divided(name, *box.cols, fmt.pack, k)),
        "scale": (*lead, _divided(name, *box.rows, fmt.row_block, n), groups),
    }
    if not fmt.symmetric:
        index["zero"] = (*lead, rows, groups)
    return index
