"""Block-diffusion self-attention: fused QKV projection, per-head q/k RMSNorm, RoPE, GQA, output projection.

The math is Qwen3's; which keys a query sees (block-causal) and where K/V live (paged cache or none) are decided
by the `AttentionInputs` the caller passes (see attention_backend). Under tensor parallelism (`shard_`) each
rank keeps its own query and KV heads (qkv_proj column-parallel, o_proj row-parallel) and caches only its KV heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention_backend import (
    AttentionInputs,
    DenseAttentionInputs,
    dense_attention,
    paged_attention,
)
from diffuserve.model.layers.linear import RowParallelLinear, column_parallel
from diffuserve.model.layers.norm import RMSNorm
from diffuserve.model.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class Attention(nn.Module):
    """Parameters follow the checkpoint names; `qkv_proj` packs q_proj | k_proj | v_proj rows (see loader).
    `qk_norm`: per-head RMSNorm of q and k before RoPE; `output_bias`: a bias on o_proj (LLaDA2 `use_bias`)."""

    def __init__(
        self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding, qk_norm: bool = True, output_bias: bool = False
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=output_bias)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qk_norm else None
        self.rotary = rotary

    def shard_(self, group: ParallelGroup) -> None:
        """Keeps this rank's heads: Hq / size query and Hkv / size KV heads (sizes checked by the caller)."""
        segments = (self.q_size, self.kv_size, self.kv_size)
        self.qkv_proj = column_parallel(self.qkv_proj, segments, group)
        self.o_proj = RowParallelLinear(self.o_proj, (self.q_size,), group)
        self.num_heads //= group.size
        self.num_kv_heads //= group.size
        self.q_size, self.kv_size = self.q_size // group.size, self.kv_size // group.size

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        """x [N, H] (paged) or [Bt, T, H] (dense); positions of the same leading shape."""
        lead = x.shape[:-1]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        if isinstance(attn, DenseAttentionInputs):
            out = dense_attention(q, k, v, attn, self.scale)
        else:
            out = paged_attention(q, k, v, attn, self.layer_id, self.scale)
        return self.o_proj(out)
