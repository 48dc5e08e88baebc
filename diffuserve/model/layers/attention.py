"""Attention: the layer, where its K/V live, and the positions it rotates. Knows nothing of requests or
schedulers.

**The layer** (`Attention`): block-diffusion self-attention, Qwen3's math: fused QKV projection, per-head q/k
RMSNorm, RoPE, GQA, output projection. Which keys a query sees (block-causal) and where K/V live (paged cache or
none) are decided by the `AttentionInputs` the caller passes. Under tensor parallelism (`shard_`) each rank keeps
its own query and KV heads (qkv_proj column-parallel, o_proj row-parallel) and caches only its KV heads.

**K/V** (`paged_attention`, `dense_attention`): attention over a paged KV cache under the step's masks, plus the
dense (no-cache) reference path. `paged_attention` writes the step's K/V into the layer's cache and hands the
real query rows to the layer's attention backend (attention_backends: loop, batched, flashinfer), which reads
the step's `PagedAttentionInputs` (attention_backends/interface: the sequences' key slots and masks, built by
`model_runner`). Slot layout (one tensor per layer, shared by all sequences):

    k_cache [num_slots, Hkv, D]     slot = page_id * page_size + offset_in_page
                                    model dtype, or e4m3 (`--kv-cache-dtype fp8`: written by `write_kv`,
                                    read back in the model's dtype by every backend)

    sequence s:  key positions 0 .. L-1  ->  key_slots[s] (page table expanded to slots)
                 queries = the last Lq of those positions (whole diffusion blocks)

**Positions** (`RotaryEmbedding`): rotary position embedding (NeoX "rotate half" layout) with the scalings a
128K model needs: the inverse-frequency formulas of transformers' `modeling_rope_utils` (default, linear,
dynamic NTK, YaRN, Llama-3) and a cos/sin table indexed by absolute position; partial rotary (only the first
`rotary_dim` of each head's dims rotate, as LLaDA2 does). NOTE: transformers' dynamic NTK recomputes the base
from the length of every forward, which a KV cache cannot follow (cached keys would have been rotated with
another base). Like vLLM, we fix the base once for the engine's `max_model_len`; below the original context
that is exactly the unscaled RoPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.config import ModelArgs, RopeArgs
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.interface import AttentionBackend, PagedAttentionInputs
from diffuserve.model.layers.attention_backends.interface import SequenceSlice as SequenceSlice  # the engine's import
from diffuserve.model.layers.linear import RowParallelLinear, column_parallel
from diffuserve.model.layers.norm import RMSNorm

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: RopeArgs, dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    factor, base = rope.factor, rope.theta
    original = rope.original_max_position_embeddings or max_position
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast or 32), correction_dim(rope.beta_slow or 1)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _llama3(rope: RopeArgs, dim: int) -> torch.Tensor:
    inv_freq = _base_inv_freq(rope.theta, dim)
    original = rope.original_max_position_embeddings
    if original is None:
        raise ValueError(
            "rope_scaling.original_max_position_embeddings: missing; rope_type llama3 needs the pre-scaling context"
        )
    low_wavelen, high_wavelen = original / rope.low_freq_factor, original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def compute_inv_freq(
    rope: RopeArgs, rotary_dim: int, max_position: int, max_model_len: int
) -> tuple[torch.Tensor, float]:
    """Returns (inv_freq [rotary_dim / 2] fp32, attention scaling applied to cos and sin)."""
    if rope.rope_type == "default":
        return _base_inv_freq(rope.theta, rotary_dim), 1.0
    if rope.rope_type == "linear":
        return _base_inv_freq(rope.theta, rotary_dim) / rope.factor, 1.0
    if rope.rope_type == "dynamic":
        seq_len = max(max_model_len, max_position)
        exponent = rotary_dim / (rotary_dim - 2)
        base = rope.theta * ((rope.factor * seq_len / max_position) - (rope.factor - 1)) ** exponent
        return _base_inv_freq(base, rotary_dim), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, rotary_dim, max_position)
    return _llama3(rope, rotary_dim), 1.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin table [max_len, rotary_dim] (fp32), applied to q and k of shape [..., N, heads, D]."""

    def __init__(self, head_dim: int, rope: RopeArgs, max_position: int, max_model_len: int) -> None:
        super().__init__()
        self.rotary_dim = int(head_dim * rope.partial_rotary_factor)
        self._table_args = (rope, max_position, max_model_len)
        cos, sin = self._tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reset_tables(self, device: torch.device | str) -> None:
        """Recomputes the tables on `device` (a model built on the meta device has none)."""
        with torch.device(device):
            self.cos, self.sin = self._tables()

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        rope, max_position, max_model_len = self._table_args
        inv_freq, scaling = compute_inv_freq(rope, self.rotary_dim, max_position, max_model_len)
        positions = torch.arange(max(max_model_len, 1), dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [L, rotary_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [L, rotary_dim]
        return emb.cos() * scaling, emb.sin() * scaling

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] (or [Bt, N]); q [.., N, Hq, D]; k [.., N, Hkv, D]."""
        cos = self.cos[positions].unsqueeze(-2).to(q.dtype)  # [.., N, 1, rotary_dim]
        sin = self.sin[positions].unsqueeze(-2).to(q.dtype)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


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


FP8_MAX = 448.0
"""The largest finite e4m3 value: an fp8 K/V cache saturates there (one scale of 1.0 per tensor)."""


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache[slots] = x [n, Hkv, D] in the cache's dtype. An fp8 (e4m3) cache takes x rounded to nearest, clamped
    to +-448 (a plain cast would turn larger values into NaN on some devices), written through a byte view: CPU
    index_copy_ has no fp8 kernel, and bytes copy the same on any device."""
    if cache.dtype != torch.float8_e4m3fn:
        cache.index_copy_(0, slots, x.to(cache.dtype))
        return
    codes = x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    cache.view(torch.uint8).index_copy_(0, slots, codes.view(torch.uint8))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: PagedAttentionInputs,
    layer_id: int,
    scale: float,
    backend: AttentionBackend,
) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's tokens (and any padding rows after them) -> [N, Hq * D].

    Writes the step's K/V into the cache first, so queries see their own block (and a block committed in the
    same forward) through the same gather as the cached prefix; `backend` then attends the real rows.
    """
    k_cache, v_cache = inputs.k_caches[layer_id], inputs.v_caches[layer_id]
    num_tokens = inputs.slot_mapping.shape[0]  # a bucket-padded forward has rows past it: no K/V, output 0
    write_kv(k_cache, inputs.slot_mapping, k[:num_tokens])
    write_kv(v_cache, inputs.slot_mapping, v[:num_tokens])
    out = backend.attend(q[:num_tokens], k_cache, v_cache, inputs, scale)
    if num_tokens == q.shape[0]:
        return out
    return torch.cat([out, out.new_zeros(q.shape[0] - num_tokens, out.shape[1])])


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
        self.o_proj: nn.Linear | RowParallelLinear = nn.Linear(self.q_size, args.hidden_size, bias=output_bias)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qk_norm else None
        self.rotary = rotary
        self.attention_backend: AttentionBackend = BatchedBackend()
        """What computes the paged attention (attention_backends.selection.set_attention_backend)."""

    def shard_(self, group: ParallelGroup) -> None:
        """Keeps this rank's heads: Hq / size query and Hkv / size KV heads (sizes checked by the caller)."""
        segments = (self.q_size, self.kv_size, self.kv_size)
        self.qkv_proj = column_parallel(self.qkv_proj, segments, group)
        assert isinstance(self.o_proj, nn.Linear), "shard_ runs once"
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
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attend(q, k, v, attn))

    @torch.compiler.disable
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        """q [..., Hq, D], k/v [..., Hkv, D] -> [..., Hq * D]. Never traced by torch.compile: the paged path walks
        the step's sequences, a Python structure that differs from step to step, and a compiled forward that
        traced it would specialise on every batch composition (and recompile until dynamo gives up and runs
        eager). The graph breaks here instead; the projections, norms and RoPE around it stay compiled."""
        if isinstance(attn, DenseAttentionInputs):
            return dense_attention(q, k, v, attn, self.scale)
        return paged_attention(q, k, v, attn, self.layer_id, self.scale, self.attention_backend)
