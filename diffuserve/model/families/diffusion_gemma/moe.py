"""DiffusionGemma's (Gemma-4's) feed-forward: a dense GeGLU MLP and, beside it on every layer, routed experts.

    dense  = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)))
    moe    = post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(h), router(h)))
    out    = post_feedforward_layernorm(dense + moe)

The router reads the *un-normed* residual h: a scale-free RMSNorm, times `scale` [H] and H^-0.5, a linear map to
E scores, softmax in fp32, the top-k renormalised to sum 1, each weight then times its expert's
`per_expert_scale`. Experts are GeGLU (tanh-approximated GELU) with transformers 5's fused layout
`experts.gate_up_proj [E, 2I, H]` (rows [gate | up]) and `experts.down_proj [E, H, I]`; tokens reach them through
layers/moe/dispatch's sorted runs (each expert once over its tokens). A model without experts (num_experts 0)
runs the dense branch alone, which is what the reference computes then (its expert sum is 0, and the norm of 0
is 0). Knows nothing of attention or requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.diffusion_gemma.norm import GemmaRMSNorm
from diffuserve.model.layers.moe.dispatch import combine, group_by_expert


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GeGLU(nn.Module):
    """`gate_up_proj` packs the checkpoint's gate_proj | up_proj rows: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(gelu_tanh(gate) * up)


class GemmaRouter(nn.Module):
    """`proj.weight` [E, H], `scale` [H], `per_expert_scale` [E]: hidden [N, H] -> (weights [N, K] fp32, ids [N, K])."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, eps: float) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm = GemmaRMSNorm(hidden_size, eps, with_scale=False)
        self.proj = nn.Linear(hidden_size, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.proj(self.norm(x) * self.scale * x.shape[-1] ** -0.5)  # [N, E]
        weights, ids = torch.topk(torch.softmax(scores, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids], ids


class GemmaExperts(nn.Module):
    """Routed GeGLU experts over sorted runs: x [N, H], weights/ids [N, K] -> [N, H]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    @torch.compiler.disable
    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        groups = group_by_expert(ids, self.gate_up_proj.shape[0])
        sorted_x = x.index_select(0, groups.token_of)  # [A, H]
        sorted_out = torch.empty_like(sorted_x)
        for expert, rows in groups.runs():
            gate, up = F.linear(sorted_x[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            sorted_out[rows] = F.linear(gelu_tanh(gate) * up, self.down_proj[expert])
        return combine(sorted_out, weights, groups, x.dtype, x.shape[0])


class GemmaFeedForward(nn.Module):
    """The layer's FFN block (module docstring). Parameter names follow the checkpoint's layer, where the norms,
    `router` and `experts` sit directly (not under `mlp`)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = GeGLU(hidden, args.intermediate_size)
        self.post_feedforward_layernorm_1 = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.router: GemmaRouter | None = None
        self.experts: GemmaExperts | None = None
        if args.is_moe:
            self.router = GemmaRouter(hidden, args.num_experts, args.num_experts_per_tok, eps)
            self.experts = GemmaExperts(args.num_experts, hidden, args.moe_intermediate_size)
            self.pre_feedforward_layernorm_2 = GemmaRMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = GemmaRMSNorm(hidden, eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] (the residual after attention) -> [..., H], before the residual add."""
        out = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
        if self.router is not None and self.experts is not None:
            flat = h.reshape(-1, h.shape[-1])  # [N, H]
            weights, ids = self.router(flat)
            routed = self.experts(self.pre_feedforward_layernorm_2(flat), weights, ids)
            out = out + self.post_feedforward_layernorm_2(routed.view(h.shape))
        return self.post_feedforward_layernorm(out)
