"""The batched LoRA delta of one linear layer, added to its output by a forward hook, so the layer, its parameter
names (the loader's, weight updates') and its kind (16-bit, quantized, row-parallel) stay as they are.

Every adapter slot s (slot 0: none, all zeros) holds, per segment i of the linear's rows (one for a plain linear;
q | k | v or gate | up for a packed one), A_s,i [r_max, in] and B_s,i [rows_i, r_max], smaller ranks padded with
zeros. Stacked over segments (a block-diagonal B) and slots:

    A  [slots * C, in]            C = segments * r_max rank columns per slot
    B  [slots * C, out]           (B transposed; segment i's columns write its own rows only)
    mask [slots, slots * C]       row s: ones on slot s's C columns (row 0 all zeros)

    delta = ((x @ A^T) * mask[slot_of_token]) @ B        x [N, in] -> [N, out]

two matmuls and one gather for the whole step, whatever mix of adapters it holds; a token of slot 0 gets exactly
0. The step's per-token slots [N] come from `lora_context`, set around the engine's forward (a forward run outside
one, e.g. a test's dense reference, adds nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

_TOKEN_SLOTS: ContextVar[torch.Tensor | None] = ContextVar("lora_token_slots", default=None)


@contextmanager
def lora_context(token_slots: torch.Tensor | None) -> Iterator[None]:
    """The adapter slot of every token [N] long of the forward inside it (None: no adapter for any token)."""
    token = _TOKEN_SLOTS.set(token_slots)
    try:
        yield
    finally:
        _TOKEN_SLOTS.reset(token)


class LoRAWeights:
    """The adapters' A / B of one linear (see the module docstring); `attach` hooks it onto the linear."""

    def __init__(self, in_features: int, out_features: int, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        self.in_features, self.out_features = in_features, out_features
        self.num_slots, self.max_rank = num_slots, max_rank
        self.dtype, self.device = dtype, device
        self.segments: list[tuple[int, int]] = []
        """(row_start, rows) of each segment, in column order."""
        self.a = torch.zeros(num_slots, 0, in_features, dtype=dtype, device=device)  # [slots, C, in]
        self.b = torch.zeros(num_slots, 0, out_features, dtype=dtype, device=device)  # [slots, C, out]
        self.mask = torch.zeros(num_slots, 0, dtype=dtype, device=device)
        self.live: set[int] = set()
        """Slots holding an adapter that adapts this linear (none: the hook adds nothing, at no cost)."""

    def attach(self, linear: nn.Module) -> None:
        linear.register_forward_hook(self._hook)

    def write(self, slot: int, row_start: int, rows: int | None, a: torch.Tensor, b: torch.Tensor) -> None:
        """Slot `slot`'s A [r, in] and scaled B [rows, r] of the segment at `row_start` (rows None: all)."""
        segment = (row_start, self.out_features if rows is None else rows)
        if segment not in self.segments:
            self._add_segment(segment)
        first = self.segments.index(segment) * self.max_rank
        rank = a.shape[0]
        self.a[slot, first : first + rank] = a.to(self.dtype)
        self.b[slot, first : first + rank, segment[0] : segment[0] + segment[1]] = b.t().to(self.dtype)
        self.live.add(slot)

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.live.discard(slot)

    def _add_segment(self, segment: tuple[int, int]) -> None:
        """Grows every slot by r_max rank columns for a segment no adapter adapted before."""
        self.segments.append(segment)
        pad = (0, 0, 0, self.max_rank)  # zeros after the existing columns, per slot
        self.a = nn.functional.pad(self.a, pad)
        self.b = nn.functional.pad(self.b, pad)
        columns = len(self.segments) * self.max_rank
        owner = torch.arange(self.num_slots * columns, device=self.device) // columns  # slot of each column
        self.mask = (owner[None, :] == torch.arange(self.num_slots, device=self.device)[:, None]).to(self.dtype)
        self.mask[0] = 0

    def delta(self, x: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
        """x [N, in], token_slots [N] -> the adapters' output [N, out]."""
        columns = self.a.shape[1]
        shrunk = x @ self.a.view(self.num_slots * columns, self.in_features).t()  # [N, slots * C]
        shrunk = shrunk * self.mask.index_select(0, token_slots)
        return shrunk @ self.b.view(self.num_slots * columns, self.out_features)

    def _hook(self, linear: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        token_slots = _TOKEN_SLOTS.get()
        if token_slots is None or not self.live:
            return output
        x = inputs[0].reshape(-1, self.in_features)
        if x.shape[0] != token_slots.shape[0]:
            raise RuntimeError(f"lora: the forward has {x.shape[0]} tokens but {token_slots.shape[0]} adapter slots")
        return output + self.delta(x.to(self.dtype), token_slots).to(output.dtype).view(output.shape)
