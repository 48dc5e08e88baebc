"""Layers against obviously-correct references: grouped MoE dispatch vs per-token einsum (and an analytic
case), RoPE scaling formulas vs transformers', rotary of a partial dimension."""

from __future__ import annotations

import math

import pytest
import torch

from diffuserve.model.config import RopeArgs
from diffuserve.model.layers.attention import RotaryEmbedding, compute_inv_freq
from diffuserve.model.layers.moe.dispatch import grouped_experts, reference_experts
from diffuserve.model.layers.moe.layer import softmax_topk


def test_grouped_dispatch_matches_reference():
    g = torch.Generator().manual_seed(0)
    num_tokens, hidden, inter, experts, top_k = 37, 16, 8, 6, 2
    x = torch.randn(num_tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g)
    down = torch.randn(experts, hidden, inter, generator=g)
    weights, ids = softmax_topk(torch.randn(num_tokens, experts, generator=g), top_k, norm_topk_prob=True)
    ids[:, 0] = torch.where(ids[:, 0] == 5, 4, ids[:, 0])  # leave some expert idle sometimes
    expected = reference_experts(x, weights, ids, gate_up, down)
    assert torch.allclose(grouped_experts(x, weights, ids, gate_up, down), expected, atol=1e-5)


def test_identity_experts_give_the_weighted_silu_by_hand():
    """Expert e: gate row = up row = e-th unit vector scaled, down = unit: out_h = sum_k w_k silu(x_e) x_e."""
    hidden, inter = 4, 1
    gate_up = torch.zeros(hidden, 2, hidden)
    down = torch.zeros(hidden, hidden, inter)
    for e in range(hidden):
        gate_up[e, 0, e] = gate_up[e, 1, e] = 1.0
        down[e, e, 0] = 1.0
    x = torch.tensor([[1.0, 3.0, 0.0, 0.0]])
    ids = torch.tensor([[0, 1]])
    weights = torch.tensor([[0.5, 0.5]])
    out = grouped_experts(x, weights, ids, gate_up, down)
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    assert torch.allclose(out, torch.tensor([[0.5 * silu(1) * 1, 0.5 * silu(3) * 3, 0.0, 0.0]]))


def test_router_renormalises_only_when_asked():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    w_norm, ids = softmax_topk(logits, 2, norm_topk_prob=True)
    w_raw, _ = softmax_topk(logits, 2, norm_topk_prob=False)
    assert ids.tolist() == [[0, 1]]
    assert torch.allclose(w_norm, torch.tensor([[0.625, 0.375]]))
    assert torch.allclose(w_raw, torch.tensor([[0.5, 0.3]]))


@pytest.mark.parametrize("max_model_len", [64, 256])
def test_dynamic_ntk_matches_transformers_at_max_model_len(max_model_len):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Qwen3Config(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    )
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=max_model_len)
    rope = RopeArgs(theta=10000.0, rope_type="dynamic", factor=4.0)
    ours, scaling = compute_inv_freq(rope, 16, 64, max_model_len)
    assert scaling == 1.0 and torch.allclose(ours, expected)


def test_partial_rotary_leaves_the_rest_untouched():
    rotary = RotaryEmbedding(8, RopeArgs(partial_rotary_factor=0.5), 32, 32)
    q = torch.randn(5, 2, 8)
    k = torch.randn(5, 1, 8)
    positions = torch.arange(5)
    q_out, k_out = rotary(positions, q, k)
    assert torch.equal(q_out[..., 4:], q[..., 4:]) and torch.equal(k_out[..., 4:], k[..., 4:])
    assert torch.allclose(q_out[0], q[0])  # position 0 rotates by nothing
    assert not torch.allclose(q_out[3, :, :4], q[3, :, :4])
