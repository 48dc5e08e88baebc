"""One forward as every rank runs it: the inputs (built by the model runner on rank 0, broadcast to worker ranks
under tensor / expert parallelism, so they are plain picklable tensors) and the rank's model shard they run on
(model part, KV cache of its KV heads, expert offload). Knows nothing of requests, decoders or scheduling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from diffuserve.engine.expert_offload import ExpertOffload
from diffuserve.model.layers.attention_backend import PagedAttentionInputs, SequenceSlice
from diffuserve.model.layers.moe_offload import BlockRef


@dataclass(frozen=True)
class ForwardInputs:
    input_ids: torch.Tensor
    """[N] the step's query tokens, requests one after another (see model_runner)."""
    positions: torch.Tensor
    """[N] their absolute positions."""
    slot_mapping: torch.Tensor
    """[N] the KV-cache slot each token's K/V is written to."""
    sequences: tuple[SequenceSlice, ...]
    blocks: tuple[BlockRef, ...]
    """The step's diffusion blocks (expert offload decides residency at a block's first step)."""

    def to(self, device: torch.device | str) -> ForwardInputs:
        sequences = tuple(
            dataclasses.replace(s, key_slots=s.key_slots.to(device), mask=None if s.mask is None else s.mask.to(device))
            for s in self.sequences
        )
        return ForwardInputs(self.input_ids.to(device), self.positions.to(device), self.slot_mapping.to(device),
                             sequences, self.blocks)


@dataclass(frozen=True)
class ModelShard:
    """One rank's part of the model and the state a forward needs."""

    model: nn.Module
    k_caches: list[torch.Tensor]
    """Per layer [num_pages * page_size, Hkv / tensor_parallel_size, D]."""
    v_caches: list[torch.Tensor]
    offload: ExpertOffload | None
    num_pages: int
    page_size: int

    def forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """-> hidden states [N, H] (the same on every rank)."""
        if self.offload is not None:
            self.offload.begin_step(inputs.blocks)
        attention = PagedAttentionInputs(inputs.slot_mapping, inputs.sequences, self.k_caches, self.v_caches)
        return self.model(inputs.input_ids, inputs.positions, attention)
