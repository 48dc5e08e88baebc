"""Mixture-of-Experts layer: a router, the routed experts' weights, an optional shared expert.

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

**Routers**: hidden states [N, H] -> (weights [N, K], expert ids [N, K]). Two rules, each one documented function
plus the module that holds its weights: the softmax top-k of Qwen3-MoE / SDAR-MoE / clover (`softmax_topk`,
`Router`) and the sigmoid, group-limited top-k of DeepSeek-V3 that LLaDA2.x / BailingMoeV2 use
(`group_limited_topk`, `GroupLimitedRouter`: `gate.weight` [E, H], `gate.expert_bias` [E]). Knows nothing of how
tokens then reach experts (see dispatch). The group-limited rule computes in fp32 and keeps its weights fp32, so a
MoE layer combines its experts in fp32 (the dispatch combines in the routing weights' dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.linear import ShardSpec, sharded_parameter
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.coreset import step_coreset_routing
from diffuserve.model.layers.moe.coreset_rule import CoresetRule
from diffuserve.model.layers.moe.dispatch import (
    ExpertGroups,
    check_backend,
    combine,
    group_by_expert,
    run_expert,
    run_experts,
)
from diffuserve.model.layers.moe.window_coreset import step_window_routing

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


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

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> the router's distribution over the experts [N, E] fp32 (what a block coreset sums)."""
        return torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)


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

    def compute(self, backend: str, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], routing weights / ids [N, K] -> the weighted sum of each token's experts [N, H] (`backend`:
        see dispatch; quantized experts replace this, model/quant/experts)."""
        return run_experts(backend, x, weights, ids, self.gate_up_proj, self.down_proj)

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
        self.coreset_size = 0
        """Block expert coreset routing (coreset.py): a denoised block's positions route within this many experts
        chosen for the block; 0 = per-token routing (set_block_coreset)."""
        self.window_rule: CoresetRule | None = None
        """The cumulative coreset rule (window_coreset.py): every window of the step routes within its coreset."""

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
        if self.coreset_size or self.window_rule is not None:
            weights, ids = self._block_coreset(flat, weights, ids)
        self.last_expert_ids = ids
        out = self._routed(flat, weights, ids)
        shared = self.shared_output(flat)
        if shared is not None:
            out = out + shared
        if self.group is not None and not self.group.expert_parallel:
            self.group.all_reduce(out)  # tensor parallel: every rank holds a partial sum over the width
        return out.view(shape)

    def shared_output(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared expert's output for x [N, H] (under tensor parallelism this rank's partial sum, reduced with
        the routed one), or None without one. A family with another shared-expert rule overrides it."""
        return None if self.shared_experts is None else self.shared_experts(x)

    @torch.compiler.disable
    def _block_coreset(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's denoised blocks (coreset.py), or every window (window_coreset.py), routed each within its
        coreset: the rows come from the step's offload_context; a forward outside the engine's steps keeps
        per-token routing."""
        if self.window_rule is not None:
            return step_window_routing(self.gate, x, weights, ids, self.window_rule)
        return step_coreset_routing(self.gate, x, weights, ids, self.coreset_size)

    @torch.compiler.disable
    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> the weighted sum of each token's K routed experts [N, H]. Never traced by torch.compile:
        how many rows each expert gets is data (host syncs, data-dependent shapes), so a compiled forward breaks
        its graph here rather than recompile for every routing; the router and shared expert stay compiled."""
        if self.runner is None and self.group is None:
            return self.experts.compute(self.backend, x, weights, ids)
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
