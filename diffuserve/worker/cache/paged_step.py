"""The paged cache kinds' torch side (PagedKV, SlidingWindowKV): a page group's K/V tensors, the per-step metadata
built on rank 0 from the scheduler's work (plain tensors, so they travel to the other ranks: where each query
token's K/V go and which cache slots each sequence's queries read under which mask), and what a forward does with
them. Which page belongs to whom is paged.py's business.

    k_caches[i], v_caches[i]   per layer of the group [num_pages * page_size, Hkv / rank, D]
                               slot = page * page_size + offset

Which keys a query sees follows the model's `StepRules` (model/interface.py):

    block-causal (SDAR, LLaDA2)   q sees k  iff  q // B >= k // B
    causal commits (Clover)       a commit row sees the positions up to itself (the recurrent prefix is causal);
                                  a block row sees the commits and its whole block (preview) or is causal too
                                  (an autoregressive checkpoint)
    sliding window (a group)      and q - k < window, q the row's own position; with
                                  StepRules.block_window_from_start a block's rows share the window behind the
                                  block's first position (DiffusionGemma's canvas rows see the W - 1 before it)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from diffuserve.core.cache.paged import FREED
from diffuserve.core.step import ScheduledRequest
from diffuserve.model.interface import StepRules
from diffuserve.model.layers.attention import PagedAttentionInputs, SequenceSlice, block_causal_mask
from diffuserve.model.shapes import PagedKV

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
"""The torch dtype of each cache dtype name (model/shapes.py)."""


@dataclass(frozen=True)
class PagedStepMetadata:
    """One page group's part of a step: slot_mapping [N] (where each query token's K/V are written) and, per
    sequence, its queries and the slots of its keys."""

    slot_mapping: torch.Tensor
    sequences: tuple[SequenceSlice, ...]

    def to(self, device: torch.device | str) -> PagedStepMetadata:
        sequences = tuple(
            dataclasses.replace(s, key_slots=s.key_slots.to(device), mask=None if s.mask is None else s.mask.to(device))
            for s in self.sequences
        )
        return PagedStepMetadata(self.slot_mapping.to(device), sequences)


class PagedMetadataBuilder:
    """Key slots, slot mapping and masks of one page group (its page tables are `Request.pages[group]`)."""

    def __init__(self, group: str, page_size: int, block_length: int, rules: StepRules, device: torch.device):
        self.group, self.page_size, self.block_length = group, page_size, block_length
        self.rules, self.device = rules, device
        self.slot_mapping: list[torch.Tensor] = []
        self.sequences: list[SequenceSlice] = []

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        """The request's own queries (commits and block), starting at batch row `first_row`."""
        key_slots = self.key_slots(work.request.pages[self.group], work.query_end)
        self.slot_mapping.append(key_slots[work.query_start :])
        self.sequences.append(SequenceSlice(first_row, work.num_tokens, key_slots, self._mask(work)))

    def add_sequence(self, slot_mapping: torch.Tensor, sequence: SequenceSlice) -> None:
        """Queries laid out by someone else (prompt scoring's variants)."""
        self.slot_mapping.append(slot_mapping)
        self.sequences.append(sequence)

    def key_slots(self, page_ids: list[int], end: int) -> torch.Tensor:
        """[end] long: cache slot of positions 0..end-1 (page * page_size + offset)."""
        pages = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        offsets = torch.arange(self.page_size, device=self.device)
        return (pages[:, None] * self.page_size + offsets).flatten()[:end]

    def build(self) -> PagedStepMetadata:
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        return PagedStepMetadata(torch.cat(self.slot_mapping) if self.slot_mapping else empty, tuple(self.sequences))

    def _mask(self, work: ScheduledRequest) -> torch.Tensor | None:
        """[Lq, L] bool, or None when every query sees every key."""
        num_commit = work.commit_end - work.commit_start
        queries = torch.arange(work.query_start, work.query_end, device=self.device)
        if not self.rules.causal_commits:
            return (
                None
                if work.num_tokens <= self.block_length
                else block_causal_mask(queries, work.query_end, self.block_length)
            )
        if not self.rules.autoregressive and num_commit == 0:
            return None
        mask = torch.arange(work.query_end, device=self.device)[None, :] <= queries[:, None]
        if not self.rules.autoregressive:
            mask[num_commit:] = True
        return mask


class WindowMetadataBuilder(PagedMetadataBuilder):
    """A sliding-window group: keys only from the request's kept pages, and the window on top of the rule (from
    each row's own position; block rows from the block's first with StepRules.block_window_from_start)."""

    def __init__(
        self, group: str, window: int, page_size: int, block_length: int, rules: StepRules, device: torch.device
    ) -> None:
        super().__init__(group, page_size, block_length, rules, device)
        self.window = window

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        pages = work.request.pages[self.group]
        first = next((i for i, p in enumerate(pages) if p != FREED), len(pages)) * self.page_size
        key_slots = self.key_slots([p if p != FREED else 0 for p in pages], work.query_end)
        self.slot_mapping.append(key_slots[work.query_start :])
        anchors = torch.arange(work.query_start, work.query_end, device=self.device)
        if self.rules.block_window_from_start:  # block rows: the window behind the block's first position
            anchors[work.commit_end - work.commit_start :] = work.request.block_start
        keys = torch.arange(first, work.query_end, device=self.device)[None, :]
        visible = anchors[:, None] - keys < self.window
        rule = self._mask(work)
        mask = visible if rule is None else visible & rule[:, first:]
        self.sequences.append(SequenceSlice(first_row, work.num_tokens, key_slots[first:], mask))


@dataclass
class PagedTensors:
    """One page group's K and V, a tensor per layer of the group."""

    specs: list[PagedKV]
    page_size: int
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]

    @classmethod
    def allocate(cls, specs: list[PagedKV], page_size: int, num_pages: int, tp: int, device: torch.device):
        def tensors() -> list[torch.Tensor]:
            return [
                torch.zeros(
                    num_pages * page_size,
                    -(-s.num_kv_heads // tp),
                    s.head_dim,
                    dtype=TORCH_DTYPES[s.dtype],
                    device=device,
                )
                for s in specs
            ]

        return cls(specs, page_size, tensors(), tensors())

    @property
    def num_pages(self) -> int:
        return self.k_caches[0].shape[0] // self.page_size

    @property
    def num_bytes(self) -> int:
        """Measured: bytes of the group's K and V tensors."""
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches)

    def bind(self, meta: PagedStepMetadata) -> PagedAttentionInputs:
        return PagedAttentionInputs(meta.slot_mapping, meta.sequences, self.k_caches, self.v_caches)
