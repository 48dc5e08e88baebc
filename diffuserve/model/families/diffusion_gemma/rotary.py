"""RoPE of DiffusionGemma's two layer kinds, as a cos/sin table over absolute positions. Knows nothing of layers.

Both kinds rotate the pairs (i, i + D/2) ("rotate half", over the whole head): `default` at the frequencies
theta^(-2i/D) for every i < D/2; `proportional` (the full layers) only for i < partial_rotary_factor * D / 2,
the other pairs at frequency 0 (cos 1, sin 0: unrotated), divided by `factor`. The inverse frequencies follow
transformers' `modeling_rope_utils` (`_compute_proportional_rope_parameters`) and DiffusionGemma's
`compute_default_rope_parameters`, in fp32 as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.families.diffusion_gemma.config import GemmaRope
from diffuserve.model.layers.attention import rotate_half


def gemma_inv_freq(rope: GemmaRope, head_dim: int) -> torch.Tensor:
    """[D / 2] fp32 inverse frequencies (zeros for the unrotated pairs of a proportional RoPE)."""
    if rope.rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (rope.theta**exponents)
    angles = int(rope.partial_rotary_factor * head_dim // 2)
    exponents = torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim
    rotated = 1.0 / (rope.theta**exponents)
    return torch.cat((rotated, torch.zeros(head_dim // 2 - angles))) / rope.factor


class GemmaRotary(nn.Module):
    """cos/sin tables [max_len, D] fp32; `forward` rotates x [..., N, heads, D] at positions [..., N]."""

    def __init__(self, rope: GemmaRope, head_dim: int, max_len: int) -> None:
        super().__init__()
        self._table_args = (rope, head_dim, max(max_len, 1))
        cos, sin = self._tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reset_tables(self, device: torch.device | str) -> None:
        """Recomputes the tables on `device` (a model built on the meta device has none)."""
        with torch.device(device):
            self.cos, self.sin = self._tables()

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        rope, head_dim, max_len = self._table_args
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), gemma_inv_freq(rope, head_dim))
        emb = torch.cat((freqs, freqs), dim=-1)  # [L, D]
        return emb.cos(), emb.sin()

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].unsqueeze(-2).to(x.dtype)  # [..., N, 1, D]
        sin = self.sin[positions].unsqueeze(-2).to(x.dtype)
        return x * cos + rotate_half(x) * sin
