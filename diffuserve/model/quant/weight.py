"""QuantWeight: one logical weight W [*lead, N, K] (this rank's part of it) stored quantized.

Two lives. While loading, its parameters are the canonical parts (formats.py), which the loader fills box by box
(`write`: pre-quantized parts, `write_float`: 16/32-bit rows quantized on the way, a chunk of rows at a time) and
whose coverage it checks (`is_complete`). `finalize` then picks the kernel for the device and activation dtype
(kernels.select_kernel) and replaces the parts by the kernel's own tensors, one matrix (expert) at a time, so
the extra memory is one matrix. `linear(x, expert)` runs the kernel. `shard` is the ShardSpec of the logical
weight (layers/linear), which the loader follows exactly as for a float parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.layers.linear import ShardSpec
from diffuserve.model.quant.formats import (
    QDTYPES,
    QuantFormat,
    QuantParts,
    Region,
    part_shapes,
    region_index,
    slice_parts,
)
from diffuserve.model.quant.kernels import Kernel, select_kernel
from diffuserve.model.quant.quantize import quantize

CHUNK_ELEMENTS = 1 << 20
"""Weights quantized at once while loading (a few MiB of fp32 temporaries: what loading holds beyond the final
weights and the checkpoint tensor being read)."""


class QuantWeight(nn.Module):
    qdata: torch.Tensor
    scale: torch.Tensor

    def __init__(
        self,
        fmt: QuantFormat,
        shape: tuple[int, ...],
        scale_dtype: torch.dtype,
        shard: ShardSpec | None = None,
        device: torch.device | str = "meta",
    ) -> None:
        super().__init__()
        self.fmt, self.shape, self.shard = fmt, tuple(shape), shard
        self.kernel: Kernel | None = None
        self.num_written = 0
        dtypes = {"qdata": QDTYPES[fmt.method], "scale": torch.float32 if fmt.method == "fp8" else scale_dtype}
        for name, part_shape in part_shapes(fmt, self.shape).items():
            data = torch.empty(part_shape, dtype=dtypes.get(name, scale_dtype), device=device)
            self.register_parameter(name, nn.Parameter(data, requires_grad=False))

    def parts(self) -> QuantParts:
        assert self.kernel is None, "a finalized weight holds its kernel's tensors, not the canonical parts"
        zero = getattr(self, "zero", None)
        return QuantParts(self.qdata, self.scale, zero)

    @property
    def is_complete(self) -> bool:
        return self.num_written == self.qdata.numel()

    @torch.no_grad()
    def write(self, box: Region, parts: QuantParts, name: str) -> None:
        """Copies pre-quantized `parts` into logical box `box` (`name`: the checkpoint weight, for errors)."""
        for part, index in region_index(self.fmt, box, self.shape, name).items():
            dst, src = getattr(self, part).data[index], getattr(parts, part)
            if src is None or dst.shape != src.shape:
                got = None if src is None else list(src.shape)
                raise ValueError(f"checkpoint: {name} has a {part} of shape {got}, expected {list(dst.shape)}")
            dst.copy_(src)
        self.num_written += parts.qdata.numel()

    def write_float(self, box: Region, rows: torch.Tensor, cols: tuple[int, int], name: str) -> None:
        """Quantizes checkpoint rows [*lead, R, K_full] (whole rows, so every rank of a column-split weight stores
        the same values) and writes their columns `cols` into box `box`."""
        k_full = rows.shape[-1]
        step = max(1, CHUNK_ELEMENTS // k_full)
        lead = rows.shape[0] if rows.dim() == 3 else None
        for e in range(lead or 1):
            matrix = rows[e] if lead is not None else rows
            for start in range(0, matrix.shape[0], step):
                chunk = matrix[start : start + step]
                # Quantized where the weight lives: on a GPU the rows cross as 16 bits, chunk by chunk.
                parts = quantize(chunk.to(self.qdata.device), self.fmt, self.scale.dtype)
                local = _columns(self.fmt, parts, cols, k_full, name)
                row_box = (box.rows[0] + start, chunk.shape[0])
                lead_box = None if box.lead is None else slice(box.lead.start + e, box.lead.start + e + 1)
                self.write(Region(lead_box, row_box, box.cols), _unsqueeze(local, lead_box is not None), name)

    def finalize(self, dtype: torch.dtype) -> None:
        """Parts -> the kernel's tensors for activations of `dtype` on the parts' device."""
        parts, (n, k) = self.parts(), self.shape[-2:]
        kernel = select_kernel(self.fmt, n, k, parts.qdata.device, dtype)
        tensors = kernel.prepare(self.fmt, parts) if len(self.shape) == 2 else self._prepare_experts(kernel, parts)
        for name in ("qdata", "scale", "zero"):
            if hasattr(self, name):
                delattr(self, name)
        for name, tensor in tensors.items():
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))
        self.kernel = kernel

    def _prepare_experts(self, kernel: Kernel, parts: QuantParts) -> dict[str, torch.Tensor]:
        """Expert by expert into [E, ...] tensors; a kernel tensor shaped like a part (int4's packed values are
        the canonical nibbles' size) takes that part's storage, expert e overwritten after expert e was read, so
        finalizing a layer's experts needs no second copy of them."""
        first = kernel.prepare(self.fmt, _matrix(parts, 0))
        free = {id(p): p for p in parts if p is not None}
        out = {}
        for key, t in first.items():
            # A part the kernel passes through keeps its storage; else any free part of the same shape takes it.
            same = [p for p in free.values() if p.shape[1:] == t.shape and p.dtype == t.dtype]
            reuse = next((p for p in same if p[0].data_ptr() == t.data_ptr()), same[0] if same else None)
            if reuse is not None:
                free.pop(id(reuse))
            out[key] = reuse if reuse is not None else t.new_empty((self.shape[0], *t.shape))
        for e in range(self.shape[0]):
            prepared = first if e == 0 else kernel.prepare(self.fmt, _matrix(parts, e))
            for key, t in prepared.items():
                if t.data_ptr() != out[key][e].data_ptr():
                    out[key][e].copy_(t)
        return out

    def linear(self, x: torch.Tensor, expert: int | None = None) -> torch.Tensor:
        """x [M, K] -> x @ W^T [M, N] (W = expert `expert`'s matrix for fused experts). The integer kernels want
        x's rows contiguous (the GDN output arrives transposed)."""
        assert self.kernel is not None, "QuantWeight.finalize runs after loading"
        x = x.contiguous()
        tensors: dict[str, torch.Tensor] = dict(self.named_parameters(recurse=False))
        if expert is not None:
            tensors = {name: t[expert] for name, t in tensors.items()}
        return self.kernel.matmul(x, self.fmt, tensors)

    def extra_repr(self) -> str:
        kernel = self.kernel.name if self.kernel is not None else "not finalized"
        return f"{self.fmt.describe()}, shape={list(self.shape)}, kernel={kernel}"


def _matrix(parts: QuantParts, e: int) -> QuantParts:
    return QuantParts(parts.qdata[e], parts.scale[e], None if parts.zero is None else parts.zero[e])


def _unsqueeze(parts: QuantParts, lead: bool) -> QuantParts:
    if not lead:
        return parts
    return QuantParts(parts.qdata[None], parts.scale[None], None if parts.zero is None else parts.zero[None])


def _columns(fmt: QuantFormat, parts: QuantParts, cols: tuple[int, int], k_full: int, name: str) -> QuantParts:
    """Columns [start, start + length) of rows quantized over their full width `k_full`."""
    if cols == (0, k_full):
        return parts
    rows = parts.qdata.shape[-2]
    return slice_parts(fmt, parts, Region(None, (0, rows), cols), (rows, k_full), name)
