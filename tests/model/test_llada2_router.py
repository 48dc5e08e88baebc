"""LLaDA2's group-limited sigmoid router against a direct, per-token implementation (ties, -inf groups, top-1),
and the MoE block's fp32 expert combine."""

from __future__ import annotations

import math

import pytest
import torch

from diffuserve.model.layers.moe.dispatch import grouped_experts, reference_experts
from diffuserve.model.layers.moe.layer import FusedExperts, GroupLimitedRouter, SparseMoeBlock, group_limited_topk


def direct_route(logits: list[float], bias: list[float], top_k: int, groups: int, topk_groups: int, scale: float):
    """One token, plain Python: the rule as models.md §1.3 states it; ties go to the lower index."""
    scores = [1 / (1 + math.exp(-v)) for v in logits]
    choice = [s + b for s, b in zip(scores, bias)]
    size = len(logits) // groups
    group_score = [sum(sorted(choice[g * size : (g + 1) * size], reverse=True)[:2]) for g in range(groups)]
    kept = sorted(range(groups), key=lambda g: (-group_score[g], g))[:topk_groups]
    allowed = [e for e in range(len(logits)) if e // size in kept]
    ids = sorted(allowed, key=lambda e: (-choice[e], e))[:top_k]
    weights = [scores[e] for e in ids]
    if top_k > 1:
        total = sum(weights) + 1e-20
        weights = [w / total for w in weights]
    return [w * scale for w in weights], ids


def _check(logits: torch.Tensor, bias: torch.Tensor, top_k: int, groups: int, topk_groups: int) -> None:
    weights, ids = group_limited_topk(logits, bias, top_k, groups, topk_groups, 2.5)
    assert weights.dtype == torch.float32
    for n in range(logits.shape[0]):
        want_w, want_ids = direct_route(logits[n].tolist(), bias.tolist(), top_k, groups, topk_groups, 2.5)
        assert ids[n].tolist() == want_ids, f"token {n}"
        assert torch.allclose(weights[n].double(), torch.tensor(want_w, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("top_k, groups, topk_groups", [(2, 4, 2), (4, 4, 2), (1, 2, 1), (3, 8, 3)])
def test_random_routing_matches_the_direct_rule(top_k, groups, topk_groups):
    gen = torch.Generator().manual_seed(top_k * 10 + groups)
    logits = torch.randn(32, 16, generator=gen)
    bias = torch.randn(16, generator=gen) * 0.3
    _check(logits, bias, top_k, groups, topk_groups)


def test_ties_go_to_the_lower_group_and_expert():
    # 8 experts in 4 groups of 2, keep 2 groups, top-3 experts. Token 0: everything ties -> groups 0, 1 and
    # experts 0, 1, 2. Token 1: group 1 is best; groups 2 and 3 tie for the second place -> group 2; expert 4
    # ties expert 5 for the third expert -> expert 4.
    logits = torch.zeros(2, 8)
    logits[1] = torch.tensor([0.0, 0.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.5])
    _check(logits, torch.zeros(8), top_k=3, groups=4, topk_groups=2)
    weights, ids = group_limited_topk(logits, torch.zeros(8), 3, 4, 2, 1.0)
    assert ids[0].tolist() == [0, 1, 2] and ids[1].tolist() == [2, 3, 4]
    assert torch.allclose(weights.sum(-1), torch.ones(2))


def test_rejected_groups_lose_even_to_negative_biased_scores():
    """The kept groups' experts all have negative biased scores; a 0.0 fill (transformers 4.x Glm4Moe) would
    pick rejected experts instead, -inf (LLaDA2) never does."""
    logits = torch.tensor([[4.0, 4.0, -4.0, -4.0, -4.0, -4.0, -4.0, -4.0]])
    bias = torch.tensor([-2.0, -2.0, -5.0, -5.0, -5.0, -5.0, -5.0, -5.0])
    weights, ids = group_limited_topk(logits, bias, 2, 4, 1, 2.5)
    assert ids[0].tolist() == [0, 1]  # biased scores about -1.02, still chosen
    assert torch.allclose(weights, torch.tensor([[1.25, 1.25]]))  # unbiased scores renormalised, times 2.5
    _check(logits, bias, top_k=2, groups=4, topk_groups=1)


def test_bias_selects_but_does_not_weigh():
    logits = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    weights, ids = group_limited_topk(logits, torch.tensor([1.0, 0.0, 0.0, 0.0]), 1, 2, 1, 2.5)
    assert ids.tolist() == [[0]]
    assert torch.allclose(weights, torch.tensor([[0.5 * 2.5]]))  # sigmoid(0), not renormalised (top-1)


def test_router_rejects_shapes_its_rule_cannot_route():
    with pytest.raises(ValueError, match="n_group"):
        GroupLimitedRouter(8, 16, 2, 3, 1, 1.0)
    with pytest.raises(ValueError, match="topk_group"):
        GroupLimitedRouter(8, 16, 5, 4, 2, 1.0)


def test_moe_block_combines_experts_in_fp32_then_casts():
    torch.manual_seed(0)
    hidden, experts, inter = 32, 8, 16
    gate = GroupLimitedRouter(experts, hidden, 2, 4, 2, 2.5)
    block = SparseMoeBlock(hidden, experts, 2, inter, True, gate=gate).to(torch.bfloat16)
    for param in block.parameters():
        torch.nn.init.normal_(param, 0, 0.2)
    x = torch.randn(10, hidden, dtype=torch.bfloat16)
    weights, ids = block.gate(x)
    assert weights.dtype == torch.float32
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
    expected = torch.zeros(10, hidden)
    for n in range(10):  # each expert in bf16, the weighted sum in fp32, one final rounding
        for k in range(2):
            g, u = torch.nn.functional.linear(x[n], gate_up[ids[n, k]]).chunk(2)
            out = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, down[ids[n, k]])
            expected[n] += out.float() * weights[n, k]
    for dispatch in (grouped_experts, reference_experts):
        got = dispatch(x, weights, ids, gate_up, down)
        assert got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), expected.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-3)
    assert block(x).shape == x.shape and block.last_expert_ids.shape == (10, 2)
    assert isinstance(block.experts, FusedExperts) and block.num_experts == experts
