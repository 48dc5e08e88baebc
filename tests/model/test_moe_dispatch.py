"""The three dispatch paths agree: grouped (sorted runs) vs the per-token einsum reference vs the usual per-expert
loop over one-hot masks, in fp32 and with bf16 experts combined in fp32; plus the grouping itself by hand."""

from __future__ import annotations

import pytest
import torch

from diffuserve.model.layers.moe.dispatch import (
    group_by_expert,
    grouped_experts,
    grouped_mm_supported,
    looped_experts,
    reference_experts,
)
from diffuserve.model.layers.moe.layer import softmax_topk


def _case(num_tokens: int, experts: int, top_k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden, inter = 16, 8
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.3).to(dtype)
    weights, ids = softmax_topk(torch.randn(num_tokens, experts, generator=g), top_k, norm_topk_prob=True)
    ids = torch.where(ids == experts - 1, 0, ids)  # the last expert stays idle
    ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % (experts - 1), ids[:, 1])
    return x, weights, ids, gate_up, down


@pytest.mark.parametrize(("num_tokens", "experts", "top_k"), [(1, 4, 2), (37, 6, 2), (64, 8, 3)])
def test_grouped_reference_and_loop_agree(num_tokens, experts, top_k):
    x, weights, ids, gate_up, down = _case(num_tokens, experts, top_k, torch.float32)
    expected = reference_experts(x, weights, ids, gate_up, down)
    assert torch.allclose(grouped_experts(x, weights, ids, gate_up, down), expected, atol=1e-5)
    assert torch.allclose(looped_experts(x, weights, ids, gate_up, down), expected, atol=1e-5)


def test_bf16_experts_with_fp32_routing_weights_agree():
    x, weights, ids, gate_up, down = _case(40, 6, 2, torch.bfloat16)
    weights = weights.float()  # LLaDA2's router: fp32 weights, the experts combine in fp32
    outs = [f(x, weights, ids, gate_up, down) for f in (grouped_experts, looped_experts, reference_experts)]
    assert all(o.dtype == torch.bfloat16 for o in outs)
    assert torch.allclose(outs[0].float(), outs[1].float(), atol=2e-2)
    assert torch.allclose(outs[0].float(), outs[2].float(), atol=2e-2)


def test_groups_are_contiguous_runs_by_expert_in_token_order():
    ids = torch.tensor([[2, 0], [0, 1], [2, 1]])  # assignments 0..5 = (token, k) row-major
    groups = group_by_expert(ids, 4)
    assert groups.counts == [2, 2, 2, 0]
    assert groups.order.tolist() == [1, 2, 3, 5, 0, 4]
    assert groups.token_of.tolist() == [0, 1, 1, 2, 0, 2]
    assert groups.runs() == [(0, slice(0, 2)), (1, slice(2, 4)), (2, slice(4, 6))]
    assert groups.runs(range(1, 3)) == [(1, slice(2, 4)), (2, slice(4, 6))]


def test_grouped_mm_is_only_used_where_pytorch_has_a_fast_kernel():
    x, _, _, gate_up, _ = _case(4, 4, 2, torch.bfloat16)
    assert not grouped_mm_supported(x, gate_up)  # CPU: the sorted-run loop
