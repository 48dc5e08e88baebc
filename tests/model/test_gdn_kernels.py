"""The CUDA-kernel adapter of the GDN scan (gdn_kernels) against contract doubles of flash-linear-attention and
causal-conv1d, on the CPU.

The packages cannot run here (no CUDA; fla's Triton kernels do not run under the interpreter), so the doubles
below implement what the packages document, in their own layouts, as plain loops written for this test and
independent of delta_rule.py:
  - fla.ops.gated_delta_rule (fla/ops/gated_delta_rule/naive.py, the kernels' docstrings): q, k [B, T, H, K],
    v [B, T, HV, V], g, beta [B, T, HV], state [B, HV, K, V] fp32; S <- exp(g) S; u = beta (v - S^T k);
    S <- S + k u^T; o = S^T (scale q). fused_recurrent reads key head j // (HV / H) (GVA); chunk, before fla 0.5,
    needs H == HV. Signatures as the kernels': chunk (q, k, v, g, beta, ...), fused_recurrent (q, k, v, g, gk, gv,
    beta, ...).
  - causal_conv1d (causal_conv1d_interface.py's *_ref and csrc/causal_conv1d.cpp's checks): x [B, D, T],
    weight [D, W], initial_states [B, D, W - 1] channel-last, final states = the last W - 1 inputs of
    [initial | x]; causal_conv1d_update advances conv_state in place.
The device check (`gdn_kernels.is_cuda`) is forced; the layer's maths is not touched.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from diffuserve import LLM
from diffuserve.config import EngineConfig
from diffuserve.model.families.clover_moe import gdn_kernels
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import DenseClover, gdn_causal
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnState, set_gdn_backend
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from tests.model.test_clover_moe_gdn import random_gdn_layer

ATOL = 1e-5


def _gated_delta_loop(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel):
    batch, length, heads, dk = q.shape
    value_heads, dv = v.shape[2:]
    if use_qk_l2norm_in_kernel:
        q, k = (t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    scale = dk**-0.5 if scale is None else scale
    state = torch.zeros(batch, value_heads, dk, dv) if initial_state is None else initial_state.float().clone()
    out = torch.zeros(batch, length, value_heads, dv)
    for b in range(batch):
        for h in range(value_heads):
            kh = h // (value_heads // heads)
            for t in range(length):
                s = state[b, h] * math.exp(g[b, t, h].item())
                u = beta[b, t, h] * (v[b, t, h] - s.T @ k[b, t, kh])
                state[b, h] = s + torch.outer(k[b, t, kh], u)
                out[b, t, h] = state[b, h].T @ (q[b, t, kh] * scale)
    return out, state


def _fake_fla(calls: list[str]) -> types.ModuleType:
    def chunk_gated_delta_rule(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
    ):
        calls.append("chunk")
        if not q.shape[2] == k.shape[2] == v.shape[2]:
            raise ValueError("fla < 0.5's chunk kernel reads key and value heads one to one")
        o, final = _gated_delta_loop(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
        return o, final if output_final_state else None

    def fused_recurrent_gated_delta_rule(
        q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False,
    ):  # fmt: skip
        calls.append("recurrent")
        assert gk is None and gv is None and g is not None and beta is not None
        o, final = _gated_delta_loop(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
        return o, final if output_final_state else None

    module = types.ModuleType("fla.ops.gated_delta_rule")
    module.chunk_gated_delta_rule = chunk_gated_delta_rule  # type: ignore[attr-defined]
    module.fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule  # type: ignore[attr-defined]
    return module


def _conv_loop(window, weight, length, activation):
    width = weight.shape[1]
    out = torch.stack([sum(window[:, :, t + j] * weight[:, j] for j in range(width)) for t in range(length)], -1)
    return out if activation is None else torch.nn.functional.silu(out)


def _fake_causal_conv1d(calls: list[str]) -> types.ModuleType:
    def causal_conv1d_fn(
        x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False, final_states_out=None,
        activation=None,
    ):  # fmt: skip
        calls.append("conv_fn")
        batch, dim, length = x.shape
        width = weight.shape[1]
        assert bias is None and seq_idx is None and final_states_out is None
        if initial_states is not None or return_final_states:
            assert x.stride(1) == 1, "initial and final states need x in channel-last layout"
        if initial_states is None:
            initial_states = x.new_zeros(batch, dim, width - 1)
        assert initial_states.shape == (batch, dim, width - 1) and initial_states.stride(1) == 1
        assert initial_states.dtype == x.dtype
        window = torch.cat([initial_states, x], dim=-1)
        out = _conv_loop(window, weight, length, activation)
        return (out, window[..., -(width - 1) :]) if return_final_states else out

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
        calls.append("conv_update")
        assert bias is None and conv_state.dtype == x.dtype and x.dim() == 3
        window = torch.cat([conv_state, x], dim=-1)
        conv_state.copy_(window[..., -conv_state.shape[-1] :])
        return _conv_loop(window[..., -(weight.shape[1] - 1 + x.shape[2]) :], weight, x.shape[2], activation)

    module = types.ModuleType("causal_conv1d")
    module.causal_conv1d_fn = causal_conv1d_fn  # type: ignore[attr-defined]
    module.causal_conv1d_update = causal_conv1d_update  # type: ignore[attr-defined]
    return module


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Installs the doubles and forces the CUDA check; -> the list of kernel calls made."""
    made: list[str] = []
    fla = _fake_fla(made)
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", fla)
    monkeypatch.setitem(sys.modules, "causal_conv1d", _fake_causal_conv1d(made))
    monkeypatch.setattr(gdn_kernels, "is_cuda", lambda device: True)
    return made


def _state(layer: GatedDeltaNet, batch: int, seed: int) -> GdnState:
    """A non-empty state (a dropped initial state must show)."""
    gen = torch.Generator().manual_seed(seed)
    empty = layer.empty_state(batch, torch.float32, torch.device("cpu"))
    return GdnState(torch.randn(empty.conv.shape, generator=gen), torch.randn(empty.recurrent.shape, generator=gen))


def _run(layer: GatedDeltaNet, backend: str, x: torch.Tensor, state: GdnState) -> tuple[torch.Tensor, GdnState]:
    layer.kernels = gdn_kernels.select(backend, torch.device("cpu"))
    with torch.no_grad():
        return gdn_causal(layer, x, state)


def _assert_same(got: tuple[torch.Tensor, GdnState], expected: tuple[torch.Tensor, GdnState]) -> None:
    torch.testing.assert_close(got[0], expected[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1].conv, expected[1].conv, atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1].recurrent, expected[1].recurrent, atol=ATOL, rtol=0)


@pytest.mark.parametrize("length, kernels", [(70, ["conv_fn", "chunk"]), (2, ["conv_fn", "chunk"]), (1, None)])
@pytest.mark.parametrize("key_heads", [2, 1])  # 4 value heads: each key head read by 2, then 4
def test_kernel_path_equals_torch_path(calls, length, kernels, key_heads):
    """Prefill across a chunk boundary (70 > 64), fewer tokens than the conv ring (2), one token; batch 2, GQA."""
    layer = random_gdn_layer(linear_num_key_heads=key_heads)
    x = torch.randn(2, length, 64, generator=torch.Generator().manual_seed(1))
    state = _state(layer, 2, seed=2)
    before = (state.conv.clone(), state.recurrent.clone())
    expected = _run(layer, "torch", x, state)
    assert calls == []
    _assert_same(_run(layer, "fla", x, state), expected)
    assert calls == (kernels or ["conv_update", "recurrent"])
    assert torch.equal(state.conv, before[0]) and torch.equal(state.recurrent, before[1])


@pytest.mark.parametrize("splits", [[5, 64, 1, 20], [1, 1, 3, 1]])
def test_kernel_state_carried_across_splits_equals_torch_whole(calls, splits):
    layer = random_gdn_layer(seed=3)
    x = torch.randn(2, sum(splits), 64, generator=torch.Generator().manual_seed(4))
    whole = _run(layer, "torch", x, layer.empty_state(2, x.dtype, x.device))
    pieces, state = [], layer.empty_state(2, x.dtype, x.device)
    for piece in x.split(splits, dim=1):
        out, state = _run(layer, "fla", piece, state)
        pieces.append(out)
    _assert_same((torch.cat(pieces, dim=1), state), whole)
    assert "recurrent" in calls and "chunk" in calls


def test_delta_rule_without_causal_conv1d_keeps_the_torch_conv(calls, monkeypatch):
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)  # not installed: importing raises ImportError
    layer = random_gdn_layer()
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(5))
    state = _state(layer, 1, seed=6)
    _assert_same(_run(layer, "auto", x, state), _run(layer, "torch", x, state))
    assert calls == ["chunk"]


def test_model_logits_through_the_kernels_equal_torch(calls, tmp_path):
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(), seed=2, diffusion=False)
    _, model = load_model(model_dir)
    ids = torch.randint(0, 300, (2, 67), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model.compute_logits(DenseClover(model).forward_causal(ids)[0])
        set_gdn_backend(model, "fla", torch.device("cpu"))
        got = model.compute_logits(DenseClover(model).forward_causal(ids)[0])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert calls.count("chunk") == hybrid_args(model.args).layer_types.count("linear_attention")


def test_automatic_choice_is_torch_on_cpu_and_without_the_packages(monkeypatch):
    cpu = torch.device("cpu")
    assert gdn_kernels.select("auto", cpu) is gdn_kernels.TORCH
    monkeypatch.setattr(gdn_kernels, "is_cuda", lambda device: True)
    monkeypatch.setitem(sys.modules, "fla", None)
    assert gdn_kernels.select("auto", cpu) is gdn_kernels.TORCH
    assert gdn_kernels.select("torch", cpu) is gdn_kernels.TORCH


def test_auto_on_cpu_is_torch_even_with_the_packages(calls, monkeypatch):
    monkeypatch.setattr(gdn_kernels, "is_cuda", lambda device: device.type == "cuda")
    assert gdn_kernels.select("auto", torch.device("cpu")) is gdn_kernels.TORCH
    with pytest.raises(ValueError, match=r"^gdn_backend: fla needs a CUDA device, the model is on cpu; use"):
        gdn_kernels.select("fla", torch.device("cpu"))


def test_fla_where_it_cannot_run_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(gdn_kernels, "is_cuda", lambda device: True)
    monkeypatch.setitem(sys.modules, "fla", None)
    with pytest.raises(ValueError) as error:
        gdn_kernels.select("fla", torch.device("cpu"))
    message = str(error.value)
    assert "\n" not in message and message.startswith("gdn_backend: fla needs flash-linear-attention")
    assert "diffuserve[cuda-kernels]" in message and "--gdn-backend auto" in message
    with pytest.raises(ValueError, match=r"^gdn_backend: 'triton' is not one of auto, torch, fla"):
        gdn_kernels.select("triton", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"^gdn_backend: must be auto, torch or fla, got 'triton'"):
        EngineConfig(model="m", gdn_backend="triton")


def test_the_engine_sets_the_backend(tmp_path):
    """`gdn_backend` reaches the layers: auto on the CPU is torch, fla is refused in one line before serving."""
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(), diffusion=False)
    llm = LLM(str(model_dir), max_num_seqs=2, max_model_len=64)
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, GatedDeltaNet)]
    assert layers and all(layer.kernels is gdn_kernels.TORCH for layer in layers)
    with pytest.raises(ValueError, match=r"^gdn_backend: fla needs a CUDA device, the model is on cpu"):
        LLM(str(model_dir), gdn_backend="fla", max_num_seqs=2, max_model_len=64)
