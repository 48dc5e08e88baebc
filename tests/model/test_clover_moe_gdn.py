"""Gated DeltaNet: the chunked and the recurrent delta rule agree (the chunked state alone too), and a sequence
split anywhere (state carried across the pieces) gives the outputs and final state of the whole sequence, for one
layer and the whole model."""

from __future__ import annotations

import pytest
import torch

from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, hybrid_args
from diffuserve.model.families.clover_moe.delta_rule import (
    chunked_delta_rule,
    chunked_delta_state,
    recurrent_delta_rule,
)
from diffuserve.model.families.clover_moe.dense import DenseClover, gdn_causal
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnState
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

ATOL = 1e-5
LAYER_ATOL = 1e-4  # a layer adds fp32 projections and norms around the rule


def _rule_inputs(length: int, heads: int = 3, dk: int = 8, dv: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(2, heads, length, dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(2, heads, length, dv, generator=gen)
    g = -torch.rand(2, heads, length, generator=gen) * 0.5
    beta = torch.rand(2, heads, length, generator=gen)
    state = torch.randn(2, heads, dk, dv, generator=gen)
    return q * dk**-0.5, k, v, g, beta, state


@pytest.mark.parametrize("length, chunk", [(1, 64), (63, 64), (64, 64), (150, 64), (37, 8)])
def test_chunked_equals_recurrent(length, chunk):
    q, k, v, g, beta, state = _rule_inputs(length)
    before = state.clone()
    out_r, state_r = recurrent_delta_rule(q, k, v, g, beta, state)
    out_c, state_c = chunked_delta_rule(q, k, v, g, beta, state, chunk_size=chunk)
    torch.testing.assert_close(out_c, out_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(state_c, state_r, atol=ATOL, rtol=0)
    assert torch.equal(state, before)


@pytest.mark.parametrize("length", [1, 5])
def test_recurrent_rule_equals_transformers_recurrent_rule(length):
    """The engine's one-token rule (batched matmuls, an in-place state update) against transformers' Qwen3.5
    `torch_recurrent_gated_delta_rule` (which scales q itself and lays tensors out [B, T, H, D])."""
    qwen = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    q, k, v, g, beta, state = _rule_inputs(length, heads=4, dk=16, dv=8, seed=9)
    out, final = recurrent_delta_rule(q, k, v, g, beta, state)
    dk = q.shape[-1]
    hf_out, hf_final = qwen.torch_recurrent_gated_delta_rule(
        *(t.transpose(1, 2) for t in (q * dk**0.5, k, v, g, beta)), initial_state=state, output_final_state=True
    )
    torch.testing.assert_close(out, hf_out.transpose(1, 2), atol=ATOL, rtol=0)
    torch.testing.assert_close(final, hf_final, atol=ATOL, rtol=0)


@pytest.mark.parametrize("length", [1, 64, 150])
def test_state_alone_equals_the_rule_state(length):
    """chunked_delta_state (the rescan baseline's rebuild) is chunked_delta_rule's state without the outputs."""
    q, k, v, g, beta, state = _rule_inputs(length, seed=4)
    assert torch.equal(chunked_delta_state(k, v, g, beta, state), chunked_delta_rule(q, k, v, g, beta, state)[1])


def random_gdn_layer(seed: int = 0, **overrides) -> GatedDeltaNet:
    """A GDN layer of the tiny clover_moe shape (config `overrides`) with seeded random weights."""
    args = clover_moe_args_from_hf(make_clover_moe_config(**overrides))
    layer = GatedDeltaNet(args.hidden_size, hybrid_args(args).gdn, args.rms_norm_eps)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        layer.A_log.copy_(torch.linspace(0.0, 2.5, layer.A_log.numel()))
    return layer.eval()


@pytest.mark.parametrize("splits", [[150], [1] * 20, [64, 64, 22], [3, 61, 1, 70, 15], [100, 1, 1, 48]])
def test_state_carried_across_splits(splits):
    layer = random_gdn_layer()
    x = torch.randn(2, sum(splits), 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole, final = gdn_causal(layer, x)
        pieces, state = [], None
        for piece in x.split(splits, dim=1):
            out, state = gdn_causal(layer, piece, state)
            pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=LAYER_ATOL, rtol=0)
    torch.testing.assert_close(state.recurrent, final.recurrent, atol=LAYER_ATOL, rtol=0)
    torch.testing.assert_close(state.conv, final.conv, atol=LAYER_ATOL, rtol=0)


def test_forward_never_modifies_its_input_state():
    layer = random_gdn_layer()
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        _, state = gdn_causal(layer, x)
        conv, recurrent = state.conv.clone(), state.recurrent.clone()
        gdn_causal(layer, x[:, :1], state)
        gdn_causal(layer, x, state)
    assert torch.equal(state.conv, conv) and torch.equal(state.recurrent, recurrent)
    assert isinstance(state, GdnState) and state.conv.shape == (1, layer.gdn.conv_dim, 3)


def test_model_prefix_split_equals_whole(tmp_path):
    model_dir = write_clover_moe_checkpoint(
        tmp_path / "m", make_clover_moe_config(num_hidden_layers=8), seed=2, init_std=0.1, diffusion=False
    )
    model = DenseClover(load_model(model_dir)[1])
    ids = torch.randint(0, 300, (2, 90), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole, _ = model.forward_causal(ids)
        state, pieces = None, []
        for piece in ids.split([5, 64, 1, 20], dim=1):
            hidden, state = model.forward_causal(piece, state)
            pieces.append(hidden)
    assert state.length == 90
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-4, rtol=0)
