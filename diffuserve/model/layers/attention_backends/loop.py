"""The reference attention backend ("loop"): one SDPA call per sequence, over that sequence's gathered K/V under
its own mask. Obviously correct and what every other backend is checked against; its cost is a Python loop of
gathers and kernel launches per sequence in every layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffuserve.model.layers.attention_backends.interface import AttentionBackend, PagedAttentionInputs


class LoopBackend(AttentionBackend):
    name = "loop"

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: PagedAttentionInputs, scale: float
    ) -> torch.Tensor:
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for seq in inputs.sequences:
            rows = slice(seq.query_start, seq.query_start + seq.query_len)
            keys = k_cache.index_select(0, seq.key_slots).to(q.dtype)  # [L, Hkv, D]
            values = v_cache.index_select(0, seq.key_slots).to(q.dtype)
            out[rows] = attend_gqa(q[rows], keys, values, seq.mask, scale)
        return out


def attend_gqa(
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
