"""The block-diffusion preview: the committed state is read and never written, a block is bidirectional inside
and reads nothing past its end, and with neutral values the operator reduces to its documented simpler forms."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, hybrid_args
from diffuserve.model.families.clover_moe.delta_rule import recurrent_delta_rule
from diffuserve.model.families.clover_moe.dense import DenseClover, gdn_causal, gdn_preview
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet
from diffuserve.model.families.clover_moe.gdn_preview import block_conv, preview_mix
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = make_clover_moe_config(num_hidden_layers=8, block_length=8)
    model_dir = write_clover_moe_checkpoint(tmp_path_factory.mktemp("preview") / "m", config, seed=1, init_std=0.1)
    _, model = load_model(model_dir)
    assert model.has_diffusion
    return DenseClover(model)


def _tensors(state):
    """Every tensor of a HybridState (conv ring and S of GDN layers, K and V of attention layers)."""
    return [t for layer in state.layers for t in dataclasses.astuple(layer)]


def test_state_is_bit_for_bit_unchanged_by_previews(model):
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, state = model.forward_causal(ids)
        before = [t.clone() for t in _tensors(state)]
        for seed in range(5):
            block = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(seed))
            model.forward_preview(block, state)
    after = _tensors(state)
    assert len(after) == 16 and all(torch.equal(a, b) for a, b in zip(after, before))


def test_block_is_bidirectional(model):
    """Changing the block's last token changes the preview at its first position (the causal path would not)."""
    prefix = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(1))
    block = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(2))
    changed = block.clone()
    changed[0, -1] = (block[0, -1] + 1) % 300
    with torch.no_grad():
        _, state = model.forward_causal(prefix)
        first = model.forward_preview(block, state)
        second = model.forward_preview(changed, state)
        causal_first = model.forward_causal(block, state)[0]
        causal_second = model.forward_causal(changed, state)[0]
    assert (first[0, 0] - second[0, 0]).abs().max() > 1e-3
    torch.testing.assert_close(causal_first[0, :-1], causal_second[0, :-1], atol=1e-5, rtol=0)


def test_right_taps_read_only_inside_the_block():
    """block_conv == the docstring's formula written out, with the taps past the block's end reading zero."""
    gen = torch.Generator().manual_seed(3)
    block, ring = torch.randn(1, 5, 6, generator=gen), torch.randn(1, 5, 3, generator=gen)
    left, right = torch.randn(5, 1, 4, generator=gen), torch.randn(5, 3, generator=gen)
    window = torch.cat([ring, block], dim=-1)
    expected = torch.zeros(1, 5, 6)
    for t in range(6):
        expected[..., t] = sum(window[..., t + j] * left[:, 0, j] for j in range(4))
        expected[..., t] += sum(block[..., t + d] * right[:, d - 1] for d in range(1, 4) if t + d < 6)
    torch.testing.assert_close(block_conv(block, ring, left, right), expected)
    longer = torch.cat([block, torch.randn(1, 5, 2, generator=gen)], dim=-1)
    assert not torch.allclose(block_conv(longer, ring, left, right)[..., 5], expected[..., 5])


def _mix_inputs(length: int = 6, heads: int = 2):
    gen = torch.Generator().manual_seed(4)
    q, k = (F.normalize(torch.randn(1, heads, length, 8, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, heads, length, 5, generator=gen)
    g = -torch.rand(1, heads, length, generator=gen)
    return q * 8**-0.5, k, v, g, torch.randn(1, heads, 8, 5, generator=gen)


def test_without_history_it_is_block_softmax_attention():
    q, k, v, g, state = _mix_inputs()
    scale = torch.tensor([3.0, 5.0])
    got = preview_mix(q, k, v, g, state, scale, torch.full((2,), float("-inf")), torch.tensor([0.7, -1.0]))
    expected = torch.cat(
        [
            F.scaled_dot_product_attention(q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], scale=float(scale[h]))
            for h in range(2)
        ],
        dim=1,
    )
    torch.testing.assert_close(got, expected)


def test_history_only_is_the_clean_state_read_out():
    """history_bias -> +inf: the causal delta rule's output with nothing written (beta = 0, g = 0)."""
    q, k, v, g, state = _mix_inputs()
    got = preview_mix(q, k, v, g, state, torch.ones(2), torch.full((2,), 1e4), torch.zeros(2))
    expected, final = recurrent_delta_rule(q, k, v, torch.zeros_like(g), torch.zeros_like(g), state)
    torch.testing.assert_close(got, expected)
    assert torch.equal(final, state)


def test_history_logit_follows_the_row_decay():
    """history_c = 1: the history weight is exp(bias + g_t) against the block's exp(logits) (by hand, 1 head)."""
    q, k, v, g, state = _mix_inputs(heads=1)
    got = preview_mix(q, k, v, g, state, torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([1.0]))
    block = torch.exp(2.0 * q[0, 0] @ k[0, 0].T)  # [T, T]
    history = torch.exp(0.5 + g[0, 0])  # [T]
    total = block.sum(-1) + history
    expected = (block @ v[0, 0] + history[:, None] * (q[0, 0] @ state[0, 0])) / total[:, None]
    torch.testing.assert_close(got[0, 0], expected)


def test_neutral_layer_is_causal_conv_then_block_attention():
    """A GDN layer with right taps 0 and no history: causal conv, then softmax attention over the block."""
    args = clover_moe_args_from_hf(make_clover_moe_config())
    gdn = hybrid_args(args).gdn
    layer = GatedDeltaNet(args.hidden_size, gdn, args.rms_norm_eps, diffusion=True)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
        layer.conv_right_weight.zero_()
        layer.bd_softmax_history_bias.fill_(float("-inf"))
        layer.bd_softmax_logit_scale.copy_(torch.tensor([2.0, 3.0, 4.0, 5.0]))
        prefix, block = torch.randn(1, 7, 64, generator=gen), torch.randn(1, 5, 64, generator=gen)
        _, state = gdn_causal(layer, prefix)
        got = gdn_preview(layer, block, state)
        window = torch.cat([state.conv, layer.in_proj_qkv(block).transpose(1, 2)], dim=-1)
        conv = F.silu(F.conv1d(window, layer.conv1d.weight, groups=gdn.conv_dim)).transpose(1, 2)
        q, k, v = conv.split([gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        q, k = (
            F.normalize(t.view(1, 5, 2, 16), dim=-1, eps=0).repeat_interleave(2, dim=2).transpose(1, 2) for t in (q, k)
        )
        v = v.view(1, 5, 4, 16).transpose(1, 2)
        o = torch.cat(
            [
                F.scaled_dot_product_attention(q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], scale=(2.0 + h) / 4)
                for h in range(4)
            ],
            dim=1,
        )
        z = layer.in_proj_z(block).view(1, 5, 4, 16)
        expected = layer.out_proj(layer.norm(o.transpose(1, 2), z).reshape(1, 5, 64))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_checkpoint_without_diffusion_tensors_runs_autoregressively(tmp_path):
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(), diffusion=False)
    model = DenseClover(load_model(model_dir)[1])
    assert not model.clover.has_diffusion
    with pytest.raises(ValueError, match="no block-diffusion tensors"):
        model.forward_preview(torch.zeros(1, 4, dtype=torch.long))
