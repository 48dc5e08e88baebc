"""Gated full attention of the Qwen3.5 / Clover trunk: GQA with zero-centred q/k RMSNorm, partial RoPE, and a
per-head, per-dimension output gate that `q_proj` emits beside the query.

    q_proj(x) -> per head [query (D) | gate (D)];  out = o_proj(attention(q, k, v) * sigmoid(gate))

A sequence's K/V so far is a `KVState`. `forward` is causal over the new tokens and returns the state with their
K/V appended; `preview` (block diffusion) lets every position of a block see the whole state and the whole block
(block-causal) and appends nothing. The attention itself is the shared dense path (layers/attention).
In the engine, `forward_paged` runs a flattened step batch over the engine's paged K/V cache instead (which keys
a query sees is the mask the engine built; see layers/attention), through the layer's attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.hybrid_norm import ZeroCenteredRMSNorm
from diffuserve.model.layers.attention import (
    DenseAttentionInputs,
    PagedAttentionInputs,
    RotaryEmbedding,
    dense_attention,
    paged_attention,
)
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.interface import AttentionBackend
from diffuserve.model.layers.linear import RowParallelLinear, column_parallel

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


@dataclass(frozen=True)
class KVState:
    """One attention layer's cache for B sequences of L committed positions (0 .. L - 1), after RoPE."""

    k: torch.Tensor
    """[B, L, Hkv, D]"""
    v: torch.Tensor


class GatedAttention(nn.Module):
    """Parameter names are the checkpoint's (`self_attn.*`)."""

    def __init__(self, args: ModelArgs, rotary: RotaryEmbedding) -> None:
        super().__init__()
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
        """What computes `forward_paged`'s attention (attention_backends.selection.set_attention_backend)."""

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

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, state: KVState | None = None
    ) -> tuple[torch.Tensor, KVState]:
        """Causal: x [B, T, H] at `positions` [T] (right after the state's L positions) -> (out, state + T)."""
        q, gate, state = self._project(x, positions, state)
        length, total = x.shape[1], state.k.shape[1]
        keys = torch.arange(total, device=x.device)
        mask = keys[None, :] <= (total - length + torch.arange(length, device=x.device))[:, None]  # [T, L + T]
        return self._attend(q, gate, state, mask), state

    def preview(self, x: torch.Tensor, positions: torch.Tensor, state: KVState | None = None) -> torch.Tensor:
        """Block: x [B, T, H] -> out [B, T, H]; every position sees the state and the whole block."""
        q, gate, full = self._project(x, positions, state)
        mask = torch.ones(x.shape[1], full.k.shape[1], dtype=torch.bool, device=x.device)
        return self._attend(q, gate, full, mask)

    def forward_paged(
        self, x: torch.Tensor, positions: torch.Tensor, attn: PagedAttentionInputs, cache_index: int
    ) -> torch.Tensor:
        """Engine step: x [N, H] at `positions` [N] -> [N, H]; writes the tokens' K/V into cache `cache_index`
        (this layer's among the attention layers) before attending, as every paged family does."""
        length = x.shape[0]
        q, gate = self.q_proj(x).view(length, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(x).view(length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(length, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, self.q_norm(q), self.k_norm(k))
        out = paged_attention(q, k, v, attn, cache_index, self.head_dim**-0.5, self.attention_backend)  # [N, Hq * D]
        return self.o_proj(out * torch.sigmoid(gate.reshape(length, -1)))

    def _project(
        self, x: torch.Tensor, positions: torch.Tensor, state: KVState | None
    ) -> tuple[torch.Tensor, torch.Tensor, KVState]:
        """-> q [B, T, Hq, D] (normed, rotated), gate [B, T, Hq * D], and the state with this x's K/V appended."""
        batch, length = x.shape[:2]
        q, gate = self.q_proj(x).view(batch, length, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, self.q_norm(q), self.k_norm(k))
        if state is not None:
            k, v = torch.cat([state.k, k], dim=1), torch.cat([state.v, v], dim=1)
        return q, gate.reshape(batch, length, -1), KVState(k, v)

    def _attend(self, q: torch.Tensor, gate: torch.Tensor, kv: KVState, mask: torch.Tensor) -> torch.Tensor:
        out = dense_attention(q, kv.k, kv.v, DenseAttentionInputs(mask[None, None]), self.head_dim**-0.5)
        return self.o_proj(out * torch.sigmoid(gate))
