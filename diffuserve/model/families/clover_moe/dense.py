"""A `clover_moe` model read whole: the oracles' forward over dense per-sequence state.

The served model (model.py) has one entry point, the engine's step over paged K/V and the state pool. The oracles
(reference/, verify/, bench/'s baselines) and the model tests read the same modules and weights another way, here,
one batch of B sequences of the same committed length at a time (the serving path never imports this module):

    DenseClover(model).forward_causal(ids, state) -> hidden, state advanced by the tokens  (prefill, autoregressive)
    DenseClover(model).forward_preview(ids, state) -> hidden of a block, state unchanged    (a denoising step)

A `HybridState` holds every layer's state after the committed prefix: a GDN layer's `GdnState` (conv ring and S),
an attention layer's `KVState` (its K/V after RoPE). A preview lets every position of the block see the whole
prefix and the whole block (the GDN layers through their block-diffusion mixer, gdn_preview). Each decoder layer is
read through a `DenseLayer` module, so forward hooks on `DenseClover.layers` see every layer's output (verify's
per-layer comparison). Knows nothing of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.gated_attention import GatedAttention
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnState
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion, HybridDecoderLayer
from diffuserve.model.layers.attention import DenseAttentionInputs, dense_attention


@dataclass(frozen=True)
class KVState:
    """One attention layer's K/V for B sequences of L committed positions (0 .. L - 1), after RoPE."""

    k: torch.Tensor
    """[B, L, Hkv, D]"""
    v: torch.Tensor


LayerState = GdnState | KVState | None


@dataclass(frozen=True)
class HybridState:
    """The committed prefix of B sequences: `length` positions and each layer's state after them."""

    length: int
    layers: tuple[LayerState, ...]


def gdn_causal(layer: GatedDeltaNet, x: torch.Tensor, state: GdnState | None = None) -> tuple[torch.Tensor, GdnState]:
    """x [B, T, H] after `state` (None: an empty prefix) -> (out [B, T, H], the state after the T tokens); the
    tensors of `state` are never modified."""
    state = state or layer.empty_state(x.shape[0], x.dtype, x.device)
    o, state = layer.scan(layer.project(x), state)
    return layer.output(x, o), state


def gdn_preview(layer: GatedDeltaNet, x: torch.Tensor, state: GdnState | None = None) -> torch.Tensor:
    """A whole block x [B, T, H] after `state`, which is read and not advanced -> out [B, T, H]."""
    state = state or layer.empty_state(x.shape[0], x.dtype, x.device)
    return layer.output(x, layer.preview_mix(layer.project(x), state))


def attention_causal(
    attn: GatedAttention, x: torch.Tensor, positions: torch.Tensor, state: KVState | None = None
) -> tuple[torch.Tensor, KVState]:
    """x [B, T, H] at `positions` [T] (right after the state's L positions) -> (out, the state with x's K/V)."""
    q, gate, state = attention_project(attn, x, positions, state)
    length, total = x.shape[1], state.k.shape[1]
    keys = torch.arange(total, device=x.device)
    mask = keys[None, :] <= (total - length + torch.arange(length, device=x.device))[:, None]  # [T, L + T]
    return _attend(attn, q, gate, state, mask), state


def attention_preview(
    attn: GatedAttention, x: torch.Tensor, positions: torch.Tensor, state: KVState | None = None
) -> torch.Tensor:
    """A block x [B, T, H] -> out [B, T, H]; every position sees the state and the whole block."""
    q, gate, full = attention_project(attn, x, positions, state)
    mask = torch.ones(x.shape[1], full.k.shape[1], dtype=torch.bool, device=x.device)
    return _attend(attn, q, gate, full, mask)


def attention_project(
    attn: GatedAttention, x: torch.Tensor, positions: torch.Tensor, state: KVState | None
) -> tuple[torch.Tensor, torch.Tensor, KVState]:
    """-> q [B, T, Hq, D] (normed, rotated), gate [B, T, Hq * D], and the state with this x's K/V appended."""
    batch, length = x.shape[:2]
    q, gate = attn.q_proj(x).view(batch, length, attn.num_heads, 2 * attn.head_dim).chunk(2, dim=-1)
    k = attn.k_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(batch, length, attn.num_kv_heads, attn.head_dim)
    q, k = attn.rotary(positions, attn.q_norm(q), attn.k_norm(k))
    if state is not None:
        k, v = torch.cat([state.k, k], dim=1), torch.cat([state.v, v], dim=1)
    return q, gate.reshape(batch, length, -1), KVState(k, v)


def _attend(attn: GatedAttention, q: torch.Tensor, gate: torch.Tensor, kv: KVState, mask: torch.Tensor) -> torch.Tensor:
    out = dense_attention(q, kv.k, kv.v, DenseAttentionInputs(mask[None, None]), attn.head_dim**-0.5)
    return attn.o_proj(out * torch.sigmoid(gate))


class DenseLayer(nn.Module):
    """One decoder layer of the serving model read whole: h = x + mixer(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, layer: HybridDecoderLayer) -> None:
        super().__init__()
        self.layer = layer

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, state: LayerState, preview: bool
    ) -> tuple[torch.Tensor, LayerState]:
        """-> (output, the layer's state after x; the unchanged `state` when previewing)."""
        layer = self.layer
        normed = layer.input_layernorm(x)
        mix = self._gdn if layer.is_gdn else self._attention
        mixed, new_state = mix(normed, positions, state, preview)
        h = x + mixed
        return h + layer.mlp(layer.post_attention_layernorm(h)), new_state

    def _gdn(
        self, x: torch.Tensor, positions: torch.Tensor, state: LayerState, preview: bool
    ) -> tuple[torch.Tensor, LayerState]:
        assert state is None or isinstance(state, GdnState)
        if preview:
            return gdn_preview(self.layer.linear_attn, x, state), state
        return gdn_causal(self.layer.linear_attn, x, state)

    def _attention(
        self, x: torch.Tensor, positions: torch.Tensor, state: LayerState, preview: bool
    ) -> tuple[torch.Tensor, LayerState]:
        assert state is None or isinstance(state, KVState)
        if preview:
            return attention_preview(self.layer.self_attn, x, positions, state), state
        return attention_causal(self.layer.self_attn, x, positions, state)


class DenseClover(nn.Module):
    """The serving model `clover` (its modules and weights, shared) with the two whole-sequence entry points."""

    def __init__(self, clover: CloverMoeForBlockDiffusion) -> None:
        super().__init__()
        self.clover = clover
        self.layers = nn.ModuleList(DenseLayer(cast(HybridDecoderLayer, layer)) for layer in clover.model.layers)

    @property
    def args(self) -> ModelArgs:
        return self.clover.args

    def empty_state(self) -> HybridState:
        return HybridState(0, (None,) * len(self.layers))

    def forward_causal(
        self, input_ids: torch.Tensor, state: HybridState | None = None
    ) -> tuple[torch.Tensor, HybridState]:
        """input_ids [B, T] after `state` -> (hidden [B, T, H] before the final norm, state after the T tokens)."""
        return self._run(input_ids, state or self.empty_state(), preview=False)

    def forward_preview(self, input_ids: torch.Tensor, state: HybridState | None = None) -> torch.Tensor:
        """A block input_ids [B, T] right after `state` -> hidden [B, T, H]; `state` is read, never written."""
        return self._run(input_ids, state or self.empty_state(), preview=True)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.clover.compute_logits(hidden)

    def _run(self, input_ids: torch.Tensor, state: HybridState, preview: bool) -> tuple[torch.Tensor, HybridState]:
        positions = state.length + torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.clover.model.embed_tokens(input_ids)
        new_states = []
        for layer, layer_state in zip(self.layers, state.layers, strict=True):
            x, layer_state = layer(x, positions, layer_state, preview)
            new_states.append(layer_state)
        length = state.length if preview else state.length + input_ids.shape[1]
        return x, HybridState(length, tuple(new_states))
