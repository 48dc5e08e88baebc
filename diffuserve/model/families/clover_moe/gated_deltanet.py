"""Gated DeltaNet (GDN) layer of the Qwen3.5 / Clover trunk: linear attention with a recurrent state.

    x -> in_proj_qkv -> depthwise causal conv (k taps, over the conv ring | the new tokens) -> SiLU -> q | k | v
    x -> in_proj_z (output gate), in_proj_b (beta = sigmoid(b)), in_proj_a (g = -exp(A_log) softplus(a + dt_bias))
    q, k L2-normalised (q also * Dk^-0.5), each key head shared by Hv / Hk value heads
    delta rule over an fp32 state S (see delta_rule) -> GatedRMSNorm(o, z) -> out_proj

A sequence's whole GDN state is a `GdnState`: the conv ring (its last k - 1 conv inputs) and S. The layer is read
in parts: `project` (the per-position inputs of the scan, `GdnInputs`), `scan` (conv and delta rule from a state,
returning the state after the tokens and never modifying the tensors it was given), `preview_mix` (block
diffusion: reads the state and writes none) and `output`. The engine step calls them over its state pool
(gdn_step), the oracles over dense per-sequence state (model/families/clover_moe/dense.py), and a baseline keeps the
projections instead of the state and rebuilds it with `scan_state` (gdn_rescan). Which delta-rule form runs is a
speed choice: the results agree (tested). `scan` runs on the torch path unless `set_gdn_backend` gave the layer
CUDA kernels (gdn_kernels); the preview and `scan_state` always run on torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.families.clover_moe.config import GdnArgs
from diffuserve.model.families.clover_moe.delta_rule import chunked_delta_state
from diffuserve.model.families.clover_moe.gdn_kernels import (
    TORCH,
    GdnKernels,
    causal_conv,
    delta_rule,
    select,
    value_heads_first,
)
from diffuserve.model.families.clover_moe.gdn_preview import (
    DIFFUSION_TENSORS,
    add_diffusion_parameters,
    block_conv,
    preview_mix,
)
from diffuserve.model.families.clover_moe.hybrid_norm import GatedRMSNorm
from diffuserve.model.layers.linear import RowParallelLinear, column_parallel, split_parameter

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


@dataclass(frozen=True)
class GdnState:
    """One layer's recurrent state for B sequences."""

    conv: torch.Tensor
    """[B, conv_dim, k - 1] in the model dtype: the last k - 1 inputs of the conv (zeros before the first token)."""
    recurrent: torch.Tensor
    """[B, Hv, Dk, Dv] fp32: S."""


class GdnInputs(NamedTuple):
    """What the causal scan reads at each of B x T positions (projections of the layer's input): the state after
    any prefix is a function of these alone."""

    mixed: torch.Tensor
    """[B, T, conv_dim] in the model dtype: in_proj_qkv, before the conv."""
    g: torch.Tensor
    """[B, T, Hv] fp32: the log-decay (<= 0)."""
    beta: torch.Tensor
    """[B, T, Hv] fp32: the write strength."""


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """Parameter names are the checkpoint's (`linear_attn.*`). `diffusion` adds the block-diffusion tensors."""

    # The block-diffusion tensors (gdn_preview.DIFFUSION_TENSORS): registered only with `diffusion`.
    conv_right_weight: nn.Parameter
    bd_softmax_logit_scale: nn.Parameter
    bd_softmax_history_bias: nn.Parameter
    bd_softmax_history_c: nn.Parameter

    def __init__(self, hidden_size: int, gdn: GdnArgs, eps: float, diffusion: bool = False) -> None:
        super().__init__()
        self.gdn = gdn
        self.in_proj_qkv = nn.Linear(hidden_size, gdn.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden_size, gdn.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden_size, gdn.num_value_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden_size, gdn.num_value_heads, bias=False)
        self.conv1d = nn.Conv1d(gdn.conv_dim, gdn.conv_dim, gdn.conv_kernel, groups=gdn.conv_dim, bias=False)
        self.A_log = nn.Parameter(torch.empty(gdn.num_value_heads))
        self.dt_bias = nn.Parameter(torch.empty(gdn.num_value_heads))
        self.norm = GatedRMSNorm(gdn.value_head_dim, eps)
        self.out_proj: nn.Linear | RowParallelLinear = nn.Linear(gdn.value_dim, hidden_size, bias=False)
        self.has_diffusion = diffusion
        self.kernels: GdnKernels = TORCH  # what runs `scan`'s conv and delta rule (set_gdn_backend)
        if diffusion:
            add_diffusion_parameters(self, gdn.conv_dim, gdn.conv_kernel, gdn.num_value_heads)

    def shard_(self, group: ParallelGroup) -> None:
        """Keeps this rank's Hk / size key heads and the Hv / size value heads that read them (value head j reads
        key head j // (Hv / Hk), so a contiguous split keeps each group on one rank): its rows of in_proj_qkv and
        conv channels per q | k | v segment, of in_proj_z / b / a, A_log, dt_bias and the preview tensors per value
        head; out_proj row-parallel (one all-reduce). The state slots of a rank hold only its heads."""
        gdn, size = self.gdn, group.size
        qkv, heads = (gdn.key_dim, gdn.key_dim, gdn.value_dim), (gdn.num_value_heads,)
        self.in_proj_qkv = column_parallel(self.in_proj_qkv, qkv, group)
        self.in_proj_z = column_parallel(self.in_proj_z, (gdn.value_dim,), group)
        self.in_proj_b = column_parallel(self.in_proj_b, heads, group)
        self.in_proj_a = column_parallel(self.in_proj_a, heads, group)
        self.conv1d.weight = split_parameter(self.conv1d.weight, qkv, group)  # [conv_dim / size, 1, k]
        self.conv1d.in_channels = self.conv1d.out_channels = self.conv1d.groups = gdn.conv_dim // size
        self.A_log = split_parameter(self.A_log, heads, group)
        self.dt_bias = split_parameter(self.dt_bias, heads, group)
        if self.has_diffusion:
            self.conv_right_weight = split_parameter(self.conv_right_weight, qkv, group)
            for name in DIFFUSION_TENSORS[1:]:
                setattr(self, name, split_parameter(getattr(self, name), heads, group))
        assert isinstance(self.out_proj, nn.Linear), "shard_ runs once"
        self.out_proj = RowParallelLinear(self.out_proj, (gdn.value_dim,), group)
        self.gdn = replace(gdn, num_key_heads=gdn.num_key_heads // size, num_value_heads=gdn.num_value_heads // size)

    def empty_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> GdnState:
        gdn = self.gdn
        conv = torch.zeros(batch, gdn.conv_dim, gdn.conv_kernel - 1, dtype=dtype, device=device)
        recurrent = torch.zeros(batch, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim, device=device)
        return GdnState(conv, recurrent)

    def project(self, x: torch.Tensor) -> GdnInputs:
        """x [B, T, H] -> the scan's inputs at those positions."""
        beta = self.in_proj_b(x).sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        return GdnInputs(self.in_proj_qkv(x), g, beta)

    def scan(self, inputs: GdnInputs, state: GdnState, in_place: bool = False) -> tuple[torch.Tensor, GdnState]:
        """The conv and the delta rule over T positions after `state` -> (o [B, Hv, T, Dv] fp32, the state after),
        on the kernels `self.kernels` (gdn_kernels). `in_place`: `state.recurrent` may be advanced where it lies
        (gdn_kernels.delta_rule) instead of copied."""
        conv, ring = causal_conv(self.kernels, inputs.mixed, state.conv, self.conv1d.weight)
        heads = self._heads(conv)
        o, recurrent = delta_rule(self.kernels, *heads, inputs.g, inputs.beta, state.recurrent, in_place=in_place)
        return o, GdnState(ring, recurrent)

    def scan_state(self, inputs: GdnInputs, state: GdnState) -> GdnState:
        """`scan`'s state alone, without the outputs (rebuilding a prefix's state: gdn_rescan), on the torch path."""
        conv, ring = causal_conv(TORCH, inputs.mixed, state.conv, self.conv1d.weight)
        _, k, v = self._qkv(conv)
        g, beta = inputs.g.transpose(1, 2), inputs.beta.transpose(1, 2)
        return GdnState(ring, chunked_delta_state(k, v, g, beta, state.recurrent))

    def preview_mix(self, inputs: GdnInputs, state: GdnState) -> torch.Tensor:
        """The preview's conv and mixer over a block's projected inputs [B, T, ...] -> o [B, Hv, T, Dv] fp32."""
        if not self.has_diffusion:
            raise ValueError(
                "GatedDeltaNet.preview_mix: this checkpoint has no block-diffusion tensors "
                "(conv_right_weight, bd_softmax_*); run it autoregressively"
            )
        conv = F.silu(block_conv(inputs.mixed.transpose(1, 2), state.conv, self.conv1d.weight, self.conv_right_weight))
        q, k, v = self._qkv(conv.transpose(1, 2))
        return preview_mix(
            q,
            k,
            v,
            inputs.g.transpose(1, 2),
            state.recurrent,
            self.bd_softmax_logit_scale,
            self.bd_softmax_history_bias,
            self.bd_softmax_history_c,
        )

    def _heads(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """conv [B, T, conv_dim] -> q, k [B, T, Hk, Dk] (L2-normalised, q * Dk^-0.5, fp32), v [B, T, Hv, Dv] fp32."""
        gdn = self.gdn
        batch, length = conv.shape[:2]
        q, k, v = conv.split([gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        q, k = (t.reshape(batch, length, gdn.num_key_heads, gdn.key_head_dim).float() for t in (q, k))
        v = v.reshape(batch, length, gdn.num_value_heads, gdn.value_head_dim).float()
        return l2_normalize(q) * gdn.key_head_dim**-0.5, l2_normalize(k), v

    def _qkv(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """conv [B, T, conv_dim] -> the torch path's q, k [B, Hv, T, Dk], v [B, Hv, T, Dv] (key heads repeated)."""
        return value_heads_first(*self._heads(conv))

    def output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """o [B, Hv, T, Dv] fp32 -> out_proj(GatedRMSNorm(o, z)) [B, T, H], z = in_proj_z(x)."""
        return self.gated_output(o.transpose(1, 2), self.in_proj_z(x))

    def gated_output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o [..., Hv, Dv] fp32, z [..., value_dim] (in_proj_z of the same positions) -> [..., H]."""
        gdn = self.gdn
        normed = self.norm(o.to(z.dtype), z.unflatten(-1, (gdn.num_value_heads, gdn.value_head_dim)))
        return self.out_proj(normed.flatten(-2))


def set_gdn_backend(model: nn.Module, backend: str, device: torch.device) -> None:
    """Every GDN layer of `model` (on `device`) runs its causal scan with `backend` (gdn_kernels.BACKENDS); a
    model without GDN layers is left as it is."""
    layers = [module for module in model.modules() if isinstance(module, GatedDeltaNet)]
    if layers:
        kernels = select(backend, device)
        for layer in layers:
            layer.kernels = kernels
