"""Tensor-parallel linear layers and the shard layout the loader follows.

A column-parallel layer keeps this rank's output rows; a row-parallel layer keeps this rank's input columns and
sums the ranks' partial outputs. Packed parameters (q | k | v rows, gate | up rows) split each packed *segment*
evenly, so rank r holds [q_r | k_r | v_r]: its own heads, whole. The `ShardSpec` attached to a parameter
(`param.shard`) says which slices of a full checkpoint tensor land where; `loader` reads it, layers never do.

    full rows  [ q0 q1 | k0 k1 | v0 v1 ]   (2 ranks)   rank 0 holds [ q0 | k0 | v0 ], rank 1 [ q1 | k1 | v1 ]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


@dataclass(frozen=True)
class ShardSpec:
    """This rank's part of a parameter split across `size` ranks along `dim`, which is the concatenation of
    `segments` (full lengths); each segment splits evenly and the rank's pieces follow in segment order."""

    dim: int
    segments: tuple[int, ...]
    rank: int
    size: int

    @property
    def full_size(self) -> int:
        return sum(self.segments)

    def pieces(self, start: int, length: int) -> list[tuple[int, int, int]]:
        """For the full range [start, start + length) along `dim`: the parts this rank holds, as
        (offset in the range, offset in the local parameter, length)."""
        out = []
        segment_start = local_start = 0
        for segment in self.segments:
            part = segment // self.size
            own = segment_start + self.rank * part  # full index of this rank's first row of the segment
            lo, hi = max(own, start), min(own + part, start + length)
            if lo < hi:
                out.append((lo - start, local_start + lo - own, hi - lo))
            segment_start += segment
            local_start += part
        return out


def sharded_parameter(shape: list[int], like: torch.Tensor, spec: ShardSpec) -> nn.Parameter:
    """A new (uninitialised) parameter of this rank's `shape`, tagged with its shard layout."""
    param = nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device), requires_grad=False)
    param.shard = spec  # type: ignore[attr-defined]  # a tag of our own on torch's Parameter (loader reads it)
    return param


def split_parameter(param: torch.Tensor, segments: tuple[int, ...], group: ParallelGroup, dim: int = 0) -> nn.Parameter:
    """This rank's part of a parameter that is not a linear layer's (a conv's taps, per-head vectors): each
    segment along `dim` split evenly, in segment order."""
    spec = ShardSpec(dim, segments, group.rank, group.size)
    shape = list(param.shape)
    shape[dim] = spec.full_size // group.size
    return sharded_parameter(shape, param, spec)


def column_parallel(linear: nn.Linear, segments: tuple[int, ...], group: ParallelGroup, replicas: int = 1) -> nn.Linear:
    """A copy of `linear`'s shape holding only this rank's output rows of each segment. `replicas` > 1: each
    part is held by that many consecutive ranks (K/V heads when the ranks outnumber them: rank r keeps part
    r // replicas of group.size // replicas)."""
    rank, size = group.rank // replicas, group.size // replicas
    spec = ShardSpec(0, segments, rank, size)
    local = nn.Linear(
        linear.in_features,
        spec.full_size // size,
        bias=linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )
    local.weight = sharded_parameter(list(local.weight.shape), linear.weight, spec)
    if linear.bias is not None:
        local.bias = sharded_parameter(list(local.bias.shape), linear.bias, spec)
    return local


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ W_r^T, plus the bias once. x_r [.., in / size] is this rank's slice of the
    input features (the output of a column-parallel layer). `reduce=False` returns the partial sum (without the
    bias) so that a caller can add other partials first and reduce once."""

    def __init__(self, linear: nn.Linear, segments: tuple[int, ...], group: ParallelGroup, reduce: bool = True) -> None:
        super().__init__()
        spec = ShardSpec(1, segments, group.rank, group.size)
        self.group, self.reduce = group, reduce
        self.weight = sharded_parameter([linear.out_features, spec.full_size // group.size], linear.weight, spec)
        self.bias = linear.bias
        if self.bias is not None and not reduce:
            raise ValueError("RowParallelLinear: a bias needs reduce=True (it is added once, after the sum)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.reduce:
            return y
        y = self.group.all_reduce(y)
        return y if self.bias is None else y + self.bias
