"""MoE routers: hidden states [N, H] -> (weights [N, K], expert ids [N, K]).

Two rules, each one documented function plus the module that holds its weights: the softmax top-k of Qwen3-MoE /
SDAR-MoE / clover (`softmax_topk`, `Router`) and the sigmoid, group-limited top-k of DeepSeek-V3 that LLaDA2.x /
BailingMoeV2 use (`group_limited_topk`, `GroupLimitedRouter`: `gate.weight` [E, H], `gate.expert_bias` [E]).
Knows nothing of how tokens then reach experts (see dispatch). The group-limited rule computes in fp32 and keeps
its weights fp32, so a MoE layer combines its experts in fp32 (the dispatch combines in the routing weights' dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

RENORM_EPS = 1e-20
"""Added to the sum of the selected scores before renormalising (the reference's guard against 0 / 0)."""


def softmax_topk(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE / SDAR-MoE routing. logits [N, E] -> (weights [N, K] in the logits' dtype, expert ids [N, K]).

    softmax in fp32 over all experts, keep the top-k, and renormalise them to sum 1 iff the HF config flag
    `norm_topk_prob` is true (Qwen3-MoE, SDAR-MoE: true; OLMoE-style LLaDA-MoE: false).
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


class Router(nn.Module):
    """`gate.weight` [E, H]: the router logits are a plain linear map of the token's hidden state."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return softmax_topk(F.linear(x, self.weight), self.top_k, self.norm_topk_prob)


def _top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """[N, X] -> [N, k] indices of the k largest values, descending; ties go to the lower index (stable sort),
    so routing is deterministic where `torch.topk`'s tie order is unspecified."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


def group_limited_topk(
    logits: torch.Tensor,
    expert_bias: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E] -> (weights [N, K] fp32, expert ids [N, K]). Config flags in brackets.

    1. scores = sigmoid(logits) in fp32 [score_function "sigmoid", router_dtype "fp32"];
    2. selection scores = scores + expert_bias [moe_router_enable_expert_bias]; the bias only *selects*;
    3. the E experts form `num_groups` equal groups [n_group]; a group's score is the sum of its two best
       selection scores; the `topk_groups` best groups are kept [topk_group], the others' experts set to -inf
       (never 0: a kept expert with a negative biased score still beats every rejected one);
    4. the top_k best remaining experts [num_experts_per_tok]; their *unbiased* scores, renormalised to sum 1
       when top_k > 1 (the reference does so whatever `norm_topk_prob` says), times `scaling_factor`
       [routed_scaling_factor].
    """
    num_tokens, num_experts = logits.shape
    scores = torch.sigmoid(logits.float())  # [N, E]
    # The bias is kept in the load dtype (bf16 checkpoints round it) and then added in fp32, as the reference does.
    choice = scores + expert_bias.float()
    grouped = choice.view(num_tokens, num_groups, num_experts // num_groups)  # [N, G, E / G]
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, G]
    kept = torch.zeros_like(group_scores, dtype=torch.bool)
    kept.scatter_(1, _top_indices(group_scores, topk_groups), True)
    choice = grouped.masked_fill(~kept[:, :, None], float("-inf")).view(num_tokens, num_experts)
    ids = _top_indices(choice, top_k)  # [N, K]
    weights = scores.gather(1, ids)
    if top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORM_EPS)
    return weights * scaling_factor, ids


class GroupLimitedRouter(nn.Module):
    """`weight` [E, H] and `expert_bias` [E] (a parameter only so the loader fills it; it is never trained here).

    Returns (weights [N, K] fp32, expert ids [N, K]) for hidden states [N, H] of any dtype."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        top_k: int,
        num_groups: int,
        topk_groups: int,
        scaling_factor: float,
    ) -> None:
        super().__init__()
        if num_experts % num_groups or num_experts // num_groups < 2:
            raise ValueError(
                f"n_group: {num_groups} must split num_experts {num_experts} into equal groups of at least 2 "
                "experts (a group is scored by its two best); fix config.json"
            )
        if top_k > topk_groups * (num_experts // num_groups):
            raise ValueError(
                f"num_experts_per_tok: {top_k} exceeds the {topk_groups} kept groups' "
                f"{topk_groups * (num_experts // num_groups)} experts; raise topk_group in config.json"
            )
        self.top_k, self.num_groups, self.topk_groups = top_k, num_groups, topk_groups
        self.scaling_factor = scaling_factor
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.expert_bias = nn.Parameter(torch.empty(num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())  # [N, E] fp32, as the reference's gate
        return group_limited_topk(
            logits, self.expert_bias, self.top_k, self.num_groups, self.topk_groups, self.scaling_factor
        )
