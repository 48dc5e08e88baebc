"""Random attention steps, for checking the attention backends against each other (tests/model, the GPU check):
hand-built `PagedAttentionInputs` of every shape the engine's runners give a step, over a randomly paged cache.

Each sequence's mask is written here from its rule, not by the engine's mask builders:

    block            one block at positions [bB, bB + B): sees every key (mask None)
    fused            block b - 1 committed with block b's step, 2B queries: block-causal (q // B >= k // B)
    prefill          a chunk of n whole blocks: block-causal (None for one block)
    hybrid           a hybrid model's c commit rows (causal: k <= q) then its block (sees every key)
    autoregressive   a hybrid checkpoint without diffusion tensors: every row causal
    variants         prompt scoring: V variants of block b, each seeing the b-block prefix and itself only;
                     keys = the prefix's slots, then V * B scratch slots (causal_variants: itself causally)

Every sequence owns its pages (no two write one slot); the cache holds random K/V everywhere else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from diffuserve.model.layers.attention_backends.interface import PagedAttentionInputs, SequenceSlice

KINDS = ("block", "fused", "prefill", "hybrid", "autoregressive", "variants", "causal_variants")


@dataclass(frozen=True)
class StepShape:
    block_length: int = 4
    page_size: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_blocks: int = 6
    """Longest context of a sequence, in blocks."""
    padding_rows: int = 0
    """Bucket padding rows after the real ones (no K/V written, output zeros)."""
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class AttentionStep:
    q: torch.Tensor
    """[N + padding, Hq, D]"""
    k: torch.Tensor
    """[N + padding, Hkv, D]: the step's own K/V (written by paged_attention)."""
    v: torch.Tensor
    inputs: PagedAttentionInputs
    """One layer's caches; `slot_mapping` covers the N real rows."""


def block_rule(query_positions: torch.Tensor, key_len: int, block_length: int) -> torch.Tensor:
    keys = torch.arange(key_len)
    return (query_positions[:, None] // block_length) >= (keys[None, :] // block_length)


def causal_rule(query_positions: torch.Tensor, key_len: int) -> torch.Tensor:
    return torch.arange(key_len)[None, :] <= query_positions[:, None]


class _Pages:
    """Hands out distinct random pages of a cache of `num_pages` pages."""

    def __init__(self, num_pages: int, page_size: int, rng: random.Random) -> None:
        self.num_slots, self.page_size = num_pages * page_size, page_size
        self.free = rng.sample(range(num_pages), num_pages)

    def slots(self, length: int) -> torch.Tensor:
        """[length] slots of fresh pages, in position order."""
        pages = [self.free.pop() for _ in range(-(-length // self.page_size))]
        return (
            torch.tensor(pages, dtype=torch.long)[:, None] * self.page_size + torch.arange(self.page_size)
        ).flatten()[:length]


@dataclass(frozen=True)
class _Sequence:
    key_slots: torch.Tensor
    positions: list[int]
    """Of the queries."""
    mask: torch.Tensor | None
    written: torch.Tensor
    """The slots the queries' K/V go to."""


def _sequence(kind: str, shape: StepShape, rng: random.Random, pages: _Pages) -> _Sequence:
    B = shape.block_length
    b = rng.randrange(1, shape.max_blocks)  # the sequence's last block is block b (b blocks before it)
    if kind in ("variants", "causal_variants"):
        return _variants(kind == "causal_variants", b - 1, B, rng, pages)  # block 0's variants have no prefix
    end = (b + 1) * B
    starts = {"block": b * B, "fused": (b - 1) * B, "prefill": rng.randrange(0, b + 1) * B}
    start = starts.get(kind, rng.randrange(0, b * B + 1))  # hybrid / autoregressive: any commit start
    positions = torch.arange(start, end)
    keys = pages.slots(end)
    mask: torch.Tensor | None = None
    if kind in ("fused", "prefill") and end - start > B:
        mask = block_rule(positions, end, B)
    elif kind in ("hybrid", "autoregressive"):
        mask = causal_rule(positions, end)
        if kind == "hybrid":
            mask[b * B - start :] = True  # the block's rows see the commits and the whole block
            mask = None if start == b * B else mask
    return _Sequence(keys, positions.tolist(), mask, keys[start:])


def _variants(causal: bool, b: int, B: int, rng: random.Random, pages: _Pages) -> _Sequence:
    count = rng.randrange(1, B + 1)
    scratch = pages.slots(count * B)
    keys = torch.cat([pages.slots(b * B), scratch])
    variant_of = torch.arange(count * B) // B
    own = variant_of[:, None] == variant_of[None, :]
    own = own.tril() if causal else own
    mask = torch.cat([torch.ones(count * B, b * B, dtype=torch.bool), own], dim=1)
    positions = list(range(b * B, (b + 1) * B)) * count
    return _Sequence(keys, positions, None if count == 1 and not causal else mask, scratch)


def _slices(laid: list[tuple[str, int, _Sequence]]) -> list[SequenceSlice]:
    """Each (kind, first row, sequence) as the model runner lays a step out: the requests' own sequences read
    their key slots from one shared tensor, one run after another; scoring variants each from a tensor of their
    own."""
    own = [seq.key_slots for kind, _, seq in laid if "variants" not in kind]
    shared = torch.cat(own) if own else torch.zeros(0, dtype=torch.long)
    sequences, start = [], 0
    for kind, row, seq in laid:
        length = len(seq.positions)
        if "variants" in kind:
            sequences.append(SequenceSlice.of(row, length, seq.key_slots, seq.mask))
            continue
        sequences.append(SequenceSlice(row, length, shared, start, len(seq.key_slots), seq.mask))
        start += len(seq.key_slots)
    return sequences


def random_step(kinds: list[str], shape: StepShape, seed: int) -> AttentionStep:
    """A step of one sequence per entry of `kinds` (in that row order), random K/V and pages from `seed`."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    pages_per_sequence = -(-2 * (shape.max_blocks + 1) * shape.block_length // shape.page_size) + 1
    pages = _Pages(len(kinds) * pages_per_sequence, shape.page_size, rng)
    laid, writes, row = [], [], 0
    for kind in kinds:
        seq = _sequence(kind, shape, rng, pages)
        laid.append((kind, row, seq))
        writes.append(seq.written)
        row += len(seq.positions)
    sequences = _slices(laid)
    H, Hkv, D = shape.num_heads, shape.num_kv_heads, shape.head_dim

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(shape.dtype)

    k_cache, v_cache = randn(pages.num_slots, Hkv, D), randn(pages.num_slots, Hkv, D)
    inputs = PagedAttentionInputs(torch.cat(writes), tuple(sequences), [k_cache], [v_cache])
    rows = row + shape.padding_rows
    return AttentionStep(randn(rows, H, D), randn(rows, Hkv, D), randn(rows, Hkv, D), inputs)


def random_kinds(rng: random.Random, max_sequences: int) -> list[str]:
    """1 .. max_sequences kinds drawn from KINDS."""
    return [rng.choice(KINDS) for _ in range(rng.randrange(1, max_sequences + 1))]
