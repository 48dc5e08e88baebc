"""The attention backend interface: how the paged attention of one layer is computed for one engine step.

A backend reads the step's `PagedAttentionInputs` (varlen queries of a flattened batch, each sequence's key
slots through the page table, each sequence's mask: see metadata) and the layer's K/V cache, into which the
step's own K/V were already written; it returns every real query row's output. It owns neither the cache write
nor the bucket padding rows (`attention.paged_attention` does both, for every backend alike), and it keeps no
state between steps except what a kernel needs allocated once (a workspace).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from diffuserve.model.layers.attention_backends.metadata import PagedAttentionInputs


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
