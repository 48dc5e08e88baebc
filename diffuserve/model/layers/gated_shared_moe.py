"""The Qwen3.5 / Clover MoE block: the shared softmax top-k routed experts (moe) plus one shared SwiGLU expert
scaled per token by `sigmoid(shared_expert_gate(x))`.

    out = routed(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)      shared_expert_gate: [1, H]

Parameter names are the checkpoint's: `gate`, `experts.{gate_up_proj, down_proj}`, `shared_expert`,
`shared_expert_gate`. The shared expert stays whole on every rank (the routed part does its own reduction).
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.layer import SparseMoeBlock


class GatedSharedExpertMoe(SparseMoeBlock):
    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int, shared_intermediate_size: int
    ) -> None:
        super().__init__(hidden_size, num_experts, top_k, intermediate_size, norm_topk_prob=True)
        self.shared_expert = SwiGLU(hidden_size, shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> [..., H]."""
        return super().forward(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
