"""The Qwen3.5 / Clover MoE block: the shared softmax top-k routed experts (moe) plus one shared SwiGLU expert
scaled per token by `sigmoid(shared_expert_gate(x))`.

    out = routed(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)      shared_expert_gate: [1, H]

Parameter names are the checkpoint's: `gate`, `experts.{gate_up_proj, down_proj}`, `shared_expert`,
`shared_expert_gate`. Under tensor parallelism the shared expert's width is split like the experts' and its
gated partial sum joins the routed one before the block's single all-reduce (the gate is a per-token scalar, so
sigmoid(g) * sum_r partial_r = sum_r sigmoid(g) * partial_r); under expert parallelism it stays whole on every
rank. The router and the gate are replicated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.layer import SparseMoeBlock

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class GatedSharedExpertMoe(SparseMoeBlock):
    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int, shared_intermediate_size: int
    ) -> None:
        super().__init__(hidden_size, num_experts, top_k, intermediate_size, norm_topk_prob=True)
        self.shared_expert = SwiGLU(hidden_size, shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def shard_(self, group: ParallelGroup) -> None:
        super().shard_(group)
        if not group.expert_parallel:
            self.shared_expert.shard_(group, reduce=False)

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> sigmoid(shared_expert_gate(x)) * shared_expert(x) [N, H]."""
        return torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
