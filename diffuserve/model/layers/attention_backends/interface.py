"""The attention backend interface: what one engine step tells its attention layers (the metadata), and what a
backend computes from it.

**The metadata** (`PagedAttentionInputs`): the flattened batch's sequences, where each query token's K/V is
written, which cached slots each sequence reads and which of them each query may see. The model runner builds it
once per step; every paged attention layer reads the same object, whatever backend computes it.

    batch rows  [ seq 0 queries | seq 1 queries | ... | padding rows (bucketed forwards) ]     N (+ pad)
    sequence s  query rows query_start .. query_start + Lq - 1
                keys       key_slots[s] = [L] cache slots (a page table expanded to slots: slot = page * page_size
                           + offset; prompt scoring's variants read a prefix's pages, then scratch slots), a run
                           of a key tensor the step's own sequences share
                mask       [Lq, L] bool, True = may attend; None = every query sees every key

A mask is explicit so that every rule the runners use is expressed exactly: the block-causal rule
(`q // block_length >= k // block_length`), a hybrid model's causal commit rows beside whole-block rows, scoring
variants that see a prefix and themselves only. Backends derive what they need from it once per step (`derived`)
and share it across layers.

**A backend** (`AttentionBackend`) reads that metadata and the layer's K/V cache, into which the step's own K/V
were already written, and returns every real query row's output. It owns neither the cache write nor the bucket
padding rows (`attention.paged_attention` does both, for every backend alike), and keeps no state between steps
except what a kernel needs allocated once (a workspace). Knows nothing of requests or schedulers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

T = TypeVar("T")


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class SequenceSlice:
    """One sequence's queries in the flattened step batch, and where its key slots are: a run of `keys`, a tensor
    the step's own sequences share (every sequence's key slots one after another), so that a step builds no tensor
    per sequence and a backend gathers a group's padded slot table from it in one index (`key_slots` is the run)."""

    query_start: int
    query_len: int
    keys: torch.Tensor
    """[K] long: cache slots, this sequence's at [key_start, key_start + num_keys)."""
    key_start: int
    num_keys: int
    """L = last query position + 1: key position i is at cache slot keys[key_start + i]."""
    mask: torch.Tensor | None
    """[Lq, L] bool, True = may attend; None when every query may see every key (one block of queries)."""

    @classmethod
    def of(cls, query_start: int, query_len: int, key_slots: torch.Tensor, mask: torch.Tensor | None) -> SequenceSlice:
        """A sequence whose key slots are a tensor of their own ([L] long)."""
        return cls(query_start, query_len, key_slots, 0, key_slots.shape[0], mask)

    @property
    def key_slots(self) -> torch.Tensor:
        """[L] long: cache slot of each key position 0..L-1 (a view of `keys`)."""
        return self.keys[self.key_start : self.key_start + self.num_keys]


@dataclass(frozen=True)
class PagedAttentionInputs:
    """Everything attention needs for one engine step. Built by the model runner, read by every layer."""

    slot_mapping: torch.Tensor
    """[N] long: the cache slot that receives each query token's K/V (rows past N are bucket padding)."""
    sequences: tuple[SequenceSlice, ...]
    """In batch-row order; together they cover rows 0..N-1 once each."""
    k_caches: list[torch.Tensor]
    """Per layer [num_slots, Hkv, D]."""
    v_caches: list[torch.Tensor]
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, key: Any, build: Callable[[], T]) -> T:
        """What a backend computes from the step's sequences (padded tables, a kernel plan), built by the first
        layer that asks and returned to the others. `key` names the backend and whatever else the result
        depends on (head counts, dtype)."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]


class AttentionBackend(ABC):
    name: ClassVar[str]
    """What `--attention-backend` calls it."""

    @abstractmethod
    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: PagedAttentionInputs, scale: float
    ) -> torch.Tensor:
        """q [N, Hq, D]: the step's real query rows; k_cache, v_cache [num_slots, Hkv, D]: this layer's (the step's
        K/V already in them) -> [N, Hq * D] in q's dtype: row i is query i's softmax(scale * q k^T) v over the keys
        its sequence's mask lets it see. GQA: query head h reads KV head h // (Hq / Hkv)."""
