"""Rotary position embedding (NeoX "rotate half" layout) with the scalings a 128K model needs.

Owns the inverse-frequency formulas of transformers' `modeling_rope_utils` (default, linear, dynamic NTK, YaRN,
Llama-3) and a cos/sin table indexed by absolute position. Supports partial rotary (only the first
`rotary_dim` of each head's dims rotate, as LLaDA2 does).

NOTE: transformers' dynamic NTK recomputes the base from the length of every forward, which a KV cache cannot
follow (cached keys would have been rotated with another base). Like vLLM, we fix the base once for the
engine's `max_model_len`; below the original context that is exactly the unscaled RoPE.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from diffuserve.model.config import RopeArgs


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
