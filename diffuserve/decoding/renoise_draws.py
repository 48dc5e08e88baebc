"""Counter-based random draws of the renoise decoder: every random number a canvas uses is a pure function of

    (request seed, canvas start position, denoising step, stream, canvas position)

hashed to 64 bits, so a request draws the same numbers whatever it is batched with, in any batch order, and a
canvas redone after a preemption draws what it drew the first time (no generator state to save). Streams: the
initial canvas (step 0), a step's samples, a step's renoise tokens.

The hash is splitmix64's finaliser `mix(z) = fmix(z + 0x9E3779B97F4A7C15)` chained over the key's fields:

    h = mix(mix(mix(mix(seed) ^ block_start) ^ (4 * step + stream)) ^ position)

in int64 tensor arithmetic (products and sums wrap mod 2^64; right shifts are made logical by a mask). From h:

    uniform token   ((h >>> 40) * V) >> 24                        (the top 24 bits scaled to [0, V), exact in int64)
    sample          u = (h >>> 40) / 2^24 (fp32, exact); the first token whose cumulative probability (fp32
                    `cumsum` of the step's softmax) exceeds u x the total: inverse-CDF categorical sampling, so a
                    token of probability 0 is never drawn. u <= 1 - 2^-24, so the fp32 product is below the total
                    (it is at most total - total x 2^-24, at least half an ulp of the total below it, and the one
                    tie, a total of 2^e, is exact): some token always exceeds it

diffuserve/reference/reference_counter_draws.py computes the same numbers in plain Python integers. Knows nothing
of requests, decoders or models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INITIAL, SAMPLE, RENOISE = 0, 1, 2
"""The streams: a canvas's initial tokens (drawn at step 0), a step's samples, a step's renoise tokens."""

_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 `z` (torch's `>>` is arithmetic: the mask drops the copied sign bits)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's step on int64 `z` (any shape): add the golden gamma, then the finaliser."""
    z = z + _signed(_GOLDEN)
    z = (z ^ _shift_right(z, 30)) * _signed(_MUL1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MUL2)
    return z ^ _shift_right(z, 31)


@dataclass(frozen=True)
class DrawKeys:
    """The per-canvas part of the key of a batch of B canvases: int64 [B] each, on the draws' device."""

    seeds: torch.Tensor
    block_starts: torch.Tensor
    steps: torch.Tensor

    @staticmethod
    def of(seeds: list[int], block_starts: list[int], steps: list[int], device: torch.device) -> DrawKeys:
        """Seeds are taken mod 2^64 (as int64 bit patterns): any Python int a request may carry is a key."""
        bits = [_signed(seed % (1 << 64)) for seed in seeds]
        table = torch.tensor([bits, block_starts, steps], dtype=torch.long, device=device)  # [3, B]
        return DrawKeys(table[0], table[1], table[2])


def draw_bits(keys: DrawKeys, stream: int, length: int) -> torch.Tensor:
    """[B, length] int64: h of every (canvas, position) of the stream, position 0..length-1."""
    canvas = mix(mix(mix(keys.seeds) ^ keys.block_starts) ^ (4 * keys.steps + stream))  # [B]
    positions = torch.arange(length, dtype=torch.long, device=keys.seeds.device)
    return mix(canvas[:, None] ^ positions[None, :])


def uniform_tokens(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bits [...] int64 -> [...] token ids uniform over [0, vocab_size)."""
    return (_shift_right(bits, 40) * vocab_size) >> 24


def sample(probs: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """probs [..., V] fp32, bits [...] -> [...] token ids drawn by inverse CDF (module docstring). The sums are a
    new tensor: torch's in-place `cumsum_` measured twice as slow on CPU."""
    cumulative = probs.cumsum(dim=-1)
    uniform = _shift_right(bits, 40).to(torch.float32) * (1.0 / (1 << 24))  # [...], exact
    target = uniform * cumulative[..., -1]
    return torch.searchsorted(cumulative, target[..., None], right=True).squeeze(-1)
