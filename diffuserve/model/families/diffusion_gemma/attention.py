"""DiffusionGemma's attention layer (Gemma-4's, both kinds) and the per-kind attention inputs it reads.

**The layer** (`GemmaAttention`): q/k projections (and v on sliding layers), per-head RMSNorm of q and k, the
scale-free RMSNorm of v, RoPE of the layer's kind, GQA, output projection, attention scale 1 (the norms take
the place of 1/sqrt(D)). Full-attention layers have no v_proj: V is the v-normed, unrotated K projection
(`attention_k_eq_v`). `qkv_proj` packs the checkpoint's q_proj | k_proj (| v_proj) rows.

**The inputs** (`GemmaAttentionInputs`): one `AttentionInputs` per layer kind, since the two kinds differ in head
shape (their own K/V caches), in which keys a query may see (the sliding window) and so in their masks and key
ranges. Whatever the window demands is in those inputs (see diffusion_gemma_masks); this module only projects
and attends through layers/attention (`paged_attention`, `dense_attention`). In the paged inputs of a kind,
`k_caches[i]` is the cache of the kind's i-th layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.diffusion_gemma.config import SLIDING, gemma_args
from diffuserve.model.families.diffusion_gemma.norm import GemmaRMSNorm
from diffuserve.model.families.diffusion_gemma.rotary import GemmaRotary
from diffuserve.model.layers.attention import AttentionInputs, DenseAttentionInputs, dense_attention, paged_attention
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.interface import AttentionBackend

ATTENTION_SCALE = 1.0
"""transformers' `self.scaling = 1.0`: q and k are RMS-normed per head instead of scaled by 1/sqrt(D)."""


@dataclass(frozen=True)
class GemmaAttentionInputs:
    """The attention inputs of a forward, per layer kind."""

    sliding: AttentionInputs
    full: AttentionInputs

    def of(self, kind: str) -> AttentionInputs:
        return self.sliding if kind == SLIDING else self.full


class GemmaAttention(nn.Module):
    """Layer `layer_id`'s attention; `rotary` is its kind's (shared by the layers of that kind)."""

    def __init__(self, args: ModelArgs, layer_id: int, rotary: GemmaRotary) -> None:
        super().__init__()
        gemma = gemma_args(args)
        shape = gemma.shape(layer_id)
        self.kind, self.cache_index = gemma.kind(layer_id), gemma.kind_index(layer_id)
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, shape.num_kv_heads, shape.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.has_v_proj = self.kind == SLIDING
        out = self.q_size + self.kv_size * (2 if self.has_v_proj else 1)
        self.qkv_proj = nn.Linear(args.hidden_size, out, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.attention_bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, args.rms_norm_eps)
        self.v_norm = GemmaRMSNorm(self.head_dim, args.rms_norm_eps, with_scale=False)
        self.rotary = rotary
        self.attention_backend: AttentionBackend = BatchedBackend()
        """What computes the paged attention (attention_backends.selection.set_attention_backend)."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: GemmaAttentionInputs) -> torch.Tensor:
        """x [N, H] (paged) or [Bt, T, H] (dense); positions of the same leading shape -> same shape as x."""
        lead = x.shape[:-1]
        projected = self.qkv_proj(x)
        q = projected[..., : self.q_size].view(*lead, self.num_heads, self.head_dim)
        k = projected[..., self.q_size : self.q_size + self.kv_size].view(*lead, self.num_kv_heads, self.head_dim)
        v = projected[..., self.q_size + self.kv_size :] if self.has_v_proj else k
        v = self.v_norm(v.reshape(*lead, self.num_kv_heads, self.head_dim))
        q = self.rotary(positions, self.q_norm(q))
        k = self.rotary(positions, self.k_norm(k))
        return self.o_proj(self.attend(q, k, v, attn.of(self.kind)))

    @torch.compiler.disable
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        """q [..., Hq, D], k/v [..., Hkv, D] -> [..., Hq * D] (the graph breaks here, as in layers/attention)."""
        if isinstance(attn, DenseAttentionInputs):
            return dense_attention(q, k, v, attn, ATTENTION_SCALE)
        return paged_attention(q, k, v, attn, self.cache_index, ATTENTION_SCALE, self.attention_backend)
