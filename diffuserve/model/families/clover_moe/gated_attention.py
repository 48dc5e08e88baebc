"""Gated full attention of the Qwen3.5 / Clover trunk: GQA with zero-centred q/k RMSNorm, partial RoPE, and a
per-head, per-dimension output gate that `q_proj` emits beside the query.

    q_proj(x) -> per head [query (D) | gate (D)];  out = o_proj(attention(q, k, v) * sigmoid(gate))

`forward` runs the engine's flattened step batch over its paged K/V cache (which keys a query sees is the mask
the engine built; see layers/attention), through the layer's attention backend. The oracles' whole-sequence
reading over dense K/V is model/families/clover_moe/dense.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.hybrid_norm import ZeroCenteredRMSNorm
from diffuserve.model.layers.attention import PagedAttentionInputs, RotaryEmbedding, paged_attention
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.interface import AttentionBackend
from diffuserve.model.layers.linear import RowParallelLinear, column_parallel

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


class GatedAttention(nn.Module):
    """Parameter names are the checkpoint's (`self_attn.*`)."""

    def __init__(self, args: ModelArgs, rotary: RotaryEmbedding, cache_index: int = 0) -> None:
        super().__init__()
        self.cache_index = cache_index
        """This layer's K/V cache among the attention layers'."""
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, 2 * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        q_size = self.num_heads * self.head_dim
        self.o_proj: nn.Linear | RowParallelLinear = nn.Linear(q_size, args.hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, args.rms_norm_eps)
        self.rotary = rotary
        self.attention_backend: AttentionBackend = BatchedBackend()
        """What computes `forward`'s attention (attention_backends.selection.set_attention_backend)."""

    def shard_(self, group: ParallelGroup) -> None:
        """Keeps this rank's Hq / size query heads with their output gates (q_proj rows [query | gate] per head)
        and the K/V heads they read: Hkv / size of them, or, when the ranks outnumber the K/V heads, the one K/V
        head of its query heads (held by size / Hkv ranks, as vLLM replicates them); o_proj row-parallel."""
        size, kv_size = group.size, self.num_kv_heads * self.head_dim
        replicas = max(1, size // self.num_kv_heads)
        self.q_proj = column_parallel(self.q_proj, (2 * self.num_heads * self.head_dim,), group)
        self.k_proj = column_parallel(self.k_proj, (kv_size,), group, replicas)
        self.v_proj = column_parallel(self.v_proj, (kv_size,), group, replicas)
        assert isinstance(self.o_proj, nn.Linear), "shard_ runs once"
        self.o_proj = RowParallelLinear(self.o_proj, (self.num_heads * self.head_dim,), group)
        self.num_heads //= size
        self.num_kv_heads = max(1, self.num_kv_heads // size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: PagedAttentionInputs) -> torch.Tensor:
        """Engine step: x [N, H] at `positions` [N] -> [N, H]; writes the tokens' K/V into cache `cache_index`
        before attending, as every paged family does."""
        length = x.shape[0]
        q, gate = self.q_proj(x).view(length, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(x).view(length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(length, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, self.q_norm(q), self.k_norm(k))
        return self.o_proj(self.attend(q, k, v, attn) * torch.sigmoid(gate.reshape(length, -1)))

    @torch.compiler.disable
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: PagedAttentionInputs) -> torch.Tensor:
        """q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq * D]. Where a compiled forward's graph breaks (as at
        `Attention.attend`): the step's sequences change every step."""
        return paged_attention(q, k, v, attn, self.cache_index, self.head_dim**-0.5, self.attention_backend)
