"""Attention over a paged KV cache under the block-causal mask, plus the dense (no-cache) reference path.

Owns the per-step metadata that says, for a flattened batch of query tokens, where each token's K/V is written
and which cached slots each sequence reads. Knows nothing of requests or schedulers: `model_runner` builds the
metadata; this module only gathers, writes and attends.

Slot layout (one tensor per layer, shared by all sequences):

    k_cache [num_slots, Hkv, D]     slot = page_id * page_size + offset_in_page

    sequence s:  key positions 0 .. L-1  ->  key_slots[s] (page table expanded to slots)
                 queries = the last Lq of those positions (whole diffusion blocks)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SequenceSlice:
    """One sequence's queries in the flattened step batch."""

    query_start: int
    query_len: int
    key_slots: torch.Tensor
    """[L] long: cache slot of each key position 0..L-1 (L = last query position + 1)."""
    mask: torch.Tensor | None
    """[Lq, L] bool, True = may attend; None when every query may see every key (one block of queries)."""


@dataclass(frozen=True)
class PagedAttentionInputs:
    """Everything attention needs for one engine step. Built by the model runner, read by every layer."""

    slot_mapping: torch.Tensor
    """[N] long: the cache slot that receives each query token's K/V."""
    sequences: tuple[SequenceSlice, ...]
    k_caches: list[torch.Tensor]
    """Per layer [num_slots, Hkv, D]."""
    v_caches: list[torch.Tensor]


@dataclass(frozen=True)
class DenseAttentionInputs:
    """No cache: every query attends over the given batch itself under an explicit mask (reference, training)."""

    mask: torch.Tensor
    """[Bt or 1, 1, T, T] bool, True = may attend."""


AttentionInputs = PagedAttentionInputs | DenseAttentionInputs


def block_causal_mask(query_positions: torch.Tensor, key_len: int, block_length: int) -> torch.Tensor:
    """[Lq, key_len] bool: query at position q sees key k iff q // block_length >= k // block_length."""
    keys = torch.arange(key_len, device=query_positions.device)
    return (query_positions // block_length)[:, None] >= (keys // block_length)[None, :]


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: PagedAttentionInputs, layer_id: int, scale: float
) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's tokens -> [N, Hq * D].

    Writes the step's K/V into the cache first, so queries see their own block (and a block committed in the
    same forward) through the same gather as the cached prefix.
    """
    k_cache, v_cache = inputs.k_caches[layer_id], inputs.v_caches[layer_id]
    k_cache.index_copy_(0, inputs.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, inputs.slot_mapping, v.to(v_cache.dtype))
    num_heads, head_dim = q.shape[1], q.shape[2]
    out = q.new_empty(q.shape[0], num_heads * head_dim)
    for seq in inputs.sequences:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        keys = k_cache.index_select(0, seq.key_slots).to(q.dtype)  # [L, Hkv, D]
        values = v_cache.index_select(0, seq.key_slots).to(q.dtype)
        out[rows] = _attend_gqa(q[rows], keys, values, seq.mask, scale)
    return out


def _attend_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """q [Lq, Hq, D], k/v [L, Hkv, D] -> [Lq, Hq * D]. The G = Hq / Hkv query heads of one KV head are folded
    into the query length, so SDPA runs with batch Hkv and never materialises repeated K/V."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    q = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * q_len, head_dim)
    if mask is not None:
        mask = mask.repeat(group, 1)  # [G * Lq, L], row g * Lq + i is query i of head g
    # A leading batch dimension lets PyTorch pick its fused (flash) CPU kernel; 3-D inputs take the slow path.
    out = F.scaled_dot_product_attention(
        q[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, scale=scale
    )[0]
    return out.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3).reshape(q_len, num_heads * head_dim)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: DenseAttentionInputs, scale: float
) -> torch.Tensor:
    """q [Bt, T, Hq, D], k/v [Bt, T, Hkv, D] -> [Bt, T, Hq * D]; K/V repeated per query head (plain reference)."""
    batch, length, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [Bt, heads, T, D]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask, scale=scale)
    return out.transpose(1, 2).reshape(batch, length, num_heads * head_dim)
