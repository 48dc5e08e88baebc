"""Mixture-of-Experts layer: a router (see router), the routed experts' weights, an optional shared expert.

The layer holds weights; *how* tokens reach experts is a dispatch function (see dispatch), so the grouped path
and the obviously-correct reference path (the tests' oracle) compute from the same parameters. Where the
experts' weights are read from is the `runner`'s business: by default this rank's `FusedExperts`; with expert
offload, a device cache in front of host memory (see offload). Either way each expert runs once over its tokens'
sorted run.

Expert weights are stored fused, in transformers 5's layout (the loader maps per-expert checkpoint names in):
    experts.gate_up_proj [E, 2 * I, H]   rows [0, I) = gate_proj, [I, 2I) = up_proj
    experts.down_proj    [E, H, I]

Parallel layouts (`shard_`): tensor parallel slices every expert's width I (and the shared expert's) and sums
the ranks' partial outputs once; expert parallel gives each rank E / size whole experts, which compute their
sorted rows for all tokens, and sums the sorted rows (each row is non-zero on exactly one rank, so the sum is
exact) before the usual combine; the shared expert then stays whole on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from diffuserve.model.layers.linear import ShardSpec, sharded_parameter
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.backends import check_backend, run_experts
from diffuserve.model.layers.moe.dispatch import ExpertGroups, combine, group_by_expert, run_expert
from diffuserve.model.layers.moe.router import Router

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class ExpertRunner(Protocol):
    def run(self, sorted_x: torch.Tensor, groups: ExpertGroups, ids: torch.Tensor, sorted_out: torch.Tensor) -> None:
        """Writes the rows of sorted_out [A, H] that belong to this rank's experts (ids [N, K]: the routing)."""


class FusedExperts(nn.Module):
    """This rank's experts: global ids [expert_offset, expert_offset + num_experts)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.expert_offset = 0
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    @property
    def local_range(self) -> range:
        return range(self.expert_offset, self.expert_offset + self.num_experts)

    def run(self, sorted_x: torch.Tensor, groups: ExpertGroups, ids: torch.Tensor, sorted_out: torch.Tensor) -> None:
        for expert, rows in groups.runs(self.local_range):
            local = expert - self.expert_offset
            sorted_out[rows] = run_expert(sorted_x[rows], self.gate_up_proj[local], self.down_proj[local])

    def shard_experts_(self, group: ParallelGroup) -> None:
        """Expert parallel: keep experts [rank * E / size, (rank + 1) * E / size), whole."""
        total, per_rank = self.num_experts, self.num_experts // group.size
        spec = ShardSpec(0, (total,), group.rank, group.size)
        self.gate_up_proj = sharded_parameter([per_rank, *self.gate_up_proj.shape[1:]], self.gate_up_proj, spec)
        self.down_proj = sharded_parameter([per_rank, *self.down_proj.shape[1:]], self.down_proj, spec)
        self.num_experts, self.expert_offset = per_rank, group.rank * per_rank

    def shard_width_(self, group: ParallelGroup) -> None:
        """Tensor parallel: keep I / size of every expert's width (gate and up rows, down columns)."""
        width, local = self.intermediate_size, self.intermediate_size // group.size
        experts, hidden = self.gate_up_proj.shape[0], self.gate_up_proj.shape[2]
        gate_up_spec = ShardSpec(1, (width, width), group.rank, group.size)
        self.gate_up_proj = sharded_parameter([experts, 2 * local, hidden], self.gate_up_proj, gate_up_spec)
        down_spec = ShardSpec(2, (width,), group.rank, group.size)
        self.down_proj = sharded_parameter([experts, hidden, local], self.down_proj, down_spec)
        self.intermediate_size = local


class SparseMoeBlock(nn.Module):
    """Routed experts (+ shared expert). `last_expert_ids` [N, K] keeps the latest routing for the engine's
    expert statistics.

    `gate` replaces the softmax top-k router: any module mapping hidden states [N, H] to (weights [N, K],
    expert ids [N, K]), e.g. LLaDA2's group-limited sigmoid router (top_k and norm_topk_prob are then its own)."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        shared_intermediate_size: int = 0,
        gate: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.last_expert_ids: torch.Tensor | None = None
        self.gate = gate if gate is not None else Router(num_experts, hidden_size, top_k, norm_topk_prob)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size)
        self.shared_experts = SwiGLU(hidden_size, shared_intermediate_size) if shared_intermediate_size else None
        self.group: ParallelGroup | None = None
        self.runner: ExpertRunner | None = None
        """Replaces `experts` as the source of expert weights (expert offload installs one)."""
        self.backend = "auto"
        """How this rank's own experts compute (see backends); offload and expert parallel keep the loop."""

    def shard_(self, group: ParallelGroup) -> None:
        """Splits the experts across the group (whole experts when expert parallel, else their width)."""
        self.group = group
        if group.expert_parallel:
            self.experts.shard_experts_(group)
            return
        self.experts.shard_width_(group)
        if self.shared_experts is not None:
            self.shared_experts.shard_(group, reduce=False)  # reduced once, with the routed partial sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [N, H]
        weights, ids = self.gate(flat)  # [N, K]
        self.last_expert_ids = ids
        out = self._routed(flat, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        if self.group is not None and not self.group.expert_parallel:
            self.group.all_reduce(out)  # tensor parallel: every rank holds a partial sum over the width
        return out.view(shape)

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> the weighted sum of each token's K routed experts [N, H]."""
        if self.runner is None and self.group is None:
            return run_experts(self.backend, x, weights, ids, self.experts.gate_up_proj, self.experts.down_proj)
        groups = group_by_expert(ids, self.num_experts)
        sorted_x = x.index_select(0, groups.token_of)  # [A, H]
        sorted_out = torch.zeros_like(sorted_x)  # expert parallel: other ranks' rows stay 0 here
        (self.runner or self.experts).run(sorted_x, groups, ids, sorted_out)
        if self.group is not None and self.group.expert_parallel:
            self.group.all_reduce(sorted_out)
        return combine(sorted_out, weights, groups, x.dtype, x.shape[0])


def set_moe_backend(model: nn.Module, backend: str) -> None:
    """Every MoE layer of `model` computes its experts with `backend` (one of backends.BACKENDS)."""
    check_backend(backend)
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            module.backend = backend
