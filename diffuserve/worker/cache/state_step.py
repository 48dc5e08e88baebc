"""The RecurrentState kind's torch side (GDN layers): the state tensors, a row per slot, the step's `StatePlan`
built on rank 0 (which slot each sequence reads and advances, which to reset or restore), and what a forward does
with them. Which slot belongs to whom is recurrent.py's business; what the GDN layers do with the rows is
model/layers/gdn_step's.

    conv_caches[i]        per GDN layer [num_slots, conv_dim / rank, k - 1]   model dtype
    recurrent_caches[i]   per GDN layer [num_slots, Hv / rank, Dk, Dv]        fp32
    last_hidden           [num_slots, H]   the final hidden state of the slot's last committed position (a
                                           block's first position is predicted from it under the AR shift)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.model.shapes import RecurrentState
from diffuserve.model.step_inputs import RecurrentStepInputs, RowGroup
from diffuserve.worker.cache.paged_step import TORCH_DTYPES


@dataclass(frozen=True)
class StatePlan:
    """A step's recurrent-state work (see model/layers/gdn_step)."""

    commits: tuple[RowGroup, ...]
    blocks: RowGroup | None
    preview: bool
    reset: torch.Tensor
    """[S] slots set to the empty prefix's state before the forward (sequences starting at position 0)."""
    restore: tuple[torch.Tensor, torch.Tensor] | None
    """(snapshot slots, sequence slots): prefix-cache hits copied in before the forward."""
    moves: tuple[torch.Tensor, torch.Tensor] | None
    """(old slots, new slots): running sequences moved down (`ScheduledRequest.move_from`), copied before the
    forward with their kept rows, after any rollback (which puts back the old slot)."""
    last_rows: torch.Tensor
    """[S] the batch row of each committing sequence's last commit token ..."""
    last_slots: torch.Tensor
    """[S] ... and its slot: that row's final hidden state is kept as the slot's `last_hidden`."""
    rollback: torch.Tensor | None = None
    """[S] slots whose last step's verified draft was rejected: put back to the copy saved before that step (the
    state at the drafted block's start, and its `last_hidden`), before anything else; None when none."""
    backup: torch.Tensor | None = None
    """[S] slots whose drafted block this step commits: copied before the forward, kept one step; None when none."""

    def to(self, device: torch.device | str) -> StatePlan:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        def group(g: RowGroup) -> RowGroup:
            return RowGroup(g.rows.to(device), g.slots.to(device), move(g.snapshot_slots), g.first_slot)

        def pair(p: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
            return None if p is None else (p[0].to(device), p[1].to(device))

        return StatePlan(
            tuple(group(g) for g in self.commits),
            None if self.blocks is None else group(self.blocks),
            self.preview,
            self.reset.to(device),
            pair(self.restore),
            pair(self.moves),
            self.last_rows.to(device),
            self.last_slots.to(device),
            move(self.rollback),
            move(self.backup),
        )


def state_slot(request: Request) -> int:
    assert request.state_slot is not None, "a running request of a model with recurrent state holds a slot"
    return request.state_slot


class StateMetadataBuilder:
    """The step's `StatePlan`: each sequence's commit run (split at a prefix snapshot's page boundary) and block,
    the slots to reset or restore, and the rows whose hidden state each slot keeps."""

    def __init__(self, block_length: int, preview: bool, device: torch.device) -> None:
        self.block_length, self.preview, self.device = block_length, preview, device

    def plan(self, scheduled: list[ScheduledRequest], variant_rows: list[tuple[int, Request]]) -> StatePlan:
        """`variant_rows`: the first batch row of each prompt-scoring variant and its request."""
        commits: dict[tuple[int, int, bool], list[tuple[int, int, int]]] = defaultdict(list)
        previews, reset, restore, moves, last_rows, last_slots = [], [], [], [], [], []
        start = 0
        for work in scheduled:
            slot = state_slot(work.request)
            if work.commit_start == 0:
                reset.append(slot)
            if work.restore_from is not None:
                restore.append((work.restore_from, slot))
            if work.move_from is not None:
                moves.append((work.move_from, slot))
            num_commit = work.commit_end - work.commit_start
            for phase, (begin, end, snapshot) in enumerate(_commit_pieces(work)):
                if end > begin:
                    commits[(phase, end - begin, snapshot >= 0)].append((start + begin, slot, snapshot))
            if num_commit:
                last_rows.append(start + num_commit - 1)
                last_slots.append(slot)
            if work.has_block and work.forwards_block:
                previews.append((start + num_commit, slot, -1))
            start += work.num_tokens
        for row, request in variant_rows:
            # A variant previews its request's slot as the block does: it reads the advanced state, never writes it.
            previews.append((row, state_slot(request), -1))
        groups = tuple(self._group(n, members, snap) for (_, n, snap), members in sorted(commits.items()))
        blocks = self._group(self.block_length, previews, False) if previews else None
        return StatePlan(
            groups,
            blocks,
            self.preview,
            self._long(reset),
            self._pairs(restore),
            self._pairs(moves),
            self._long(last_rows),
            self._long(last_slots),
        )

    def _pairs(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(sources, destinations) of slot copies, or None when there are none."""
        return (self._long([s for s, _ in pairs]), self._long([d for _, d in pairs])) if pairs else None

    def _group(self, length: int, members: list[tuple[int, int, int]], has_snapshot: bool) -> RowGroup:
        """Runs of `length` tokens starting at batch rows members[i][0] of slots members[i][1], in slot order (the
        layers gather rows by index anyway; in slot order, sequences holding one range of slots are a view)."""
        members = sorted(members, key=lambda member: member[1])
        rows = self._long([start for start, _, _ in members])[:, None] + torch.arange(length, device=self.device)
        snapshots = self._long([snap for _, _, snap in members]) if has_snapshot else None
        slots = [slot for _, slot, _ in members]
        return RowGroup(rows, self._long(slots), snapshots, consecutive_start(slots))

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def consecutive_start(slots: list[int]) -> int | None:
    """slots[0] when the slots are slots[0], slots[0] + 1, ... (one range of the pool), else None."""
    first = slots[0]
    return first if slots == list(range(first, first + len(slots))) else None


def _commit_pieces(work: ScheduledRequest) -> list[tuple[int, int, int]]:
    """The commit run as (begin, end, snapshot slot or -1) pieces in batch-relative offsets: split where a
    snapshot is taken, so the state after the first piece can be copied before the second runs."""
    num_commit = work.commit_end - work.commit_start
    if work.snapshot is None:
        return [(0, num_commit, -1)]
    split = work.snapshot.position - work.commit_start
    return [(0, split, work.snapshot.slot), (split, num_commit, -1)]


@dataclass
class StateTensors:
    """The recurrent state of every GDN layer, a row per slot (see the module docstring)."""

    conv_caches: list[torch.Tensor]
    recurrent_caches: list[torch.Tensor]
    last_hidden: torch.Tensor
    saved: tuple[torch.Tensor, list[torch.Tensor]] | None = None
    """(slots, a copy of their rows of every tensor above): the last step's `StatePlan.backup`."""

    @classmethod
    def allocate(cls, specs: list[RecurrentState], num_slots: int, hidden_size: int, tp: int, device: torch.device):
        conv = [
            torch.zeros(num_slots, s.conv_dim(tp), s.conv_kernel - 1, dtype=TORCH_DTYPES[s.conv_dtype], device=device)
            for s in specs
        ]
        recurrent = [
            torch.zeros(
                num_slots,
                -(-s.num_value_heads // tp),
                s.key_head_dim,
                s.value_head_dim,
                dtype=TORCH_DTYPES[s.state_dtype],
                device=device,
            )
            for s in specs
        ]
        hidden_dtype = TORCH_DTYPES[specs[0].conv_dtype]
        return cls(conv, recurrent, torch.zeros(num_slots, hidden_size, dtype=hidden_dtype, device=device))

    @property
    def num_slots(self) -> int:
        return self.last_hidden.shape[0]

    def state_bytes_per_slot(self) -> int:
        """Measured: bytes of GDN state one slot holds (conv rings + S over every GDN layer)."""
        return sum(t[0].numel() * t.element_size() for t in self.conv_caches + self.recurrent_caches)

    @property
    def slot_bytes(self) -> int:
        """What one slot holds in all: the GDN state and the last committed hidden row."""
        return self.state_bytes_per_slot() + self.last_hidden[0].numel() * self.last_hidden.element_size()

    def bind(self, plan: StatePlan) -> RecurrentStepInputs:
        return RecurrentStepInputs(self.conv_caches, self.recurrent_caches, plan.commits, plan.blocks, plan.preview)

    def before_forward(self, plan: StatePlan) -> None:
        """Rejected drafts' slots put back, moved sequences copied (state and kept row) into their new slots,
        prefix-cache hits copied into their slots, then slots of sequences starting at position 0 emptied; then the
        slots of drafts this step commits are saved."""
        self._roll_back(plan.rollback)
        if plan.moves is not None:
            src, dst = plan.moves
            for t in self._tensors():
                t.index_copy_(0, dst, t[src])  # every source read before any write: a slot may be both
        if plan.restore is not None:
            src, dst = plan.restore
            for t in self.conv_caches + self.recurrent_caches:
                t.index_copy_(0, dst, t[src])
        if plan.reset.numel():
            for t in self.conv_caches + self.recurrent_caches:
                t.index_fill_(0, plan.reset, 0)
        if plan.backup is not None:
            self.saved = (plan.backup, [t[plan.backup] for t in self._tensors()])

    def _roll_back(self, slots: torch.Tensor | None) -> None:
        """Puts `slots` back to the copy the last step saved (each of them was saved), and drops the copy."""
        saved, self.saved = self.saved, None
        if slots is None:
            return
        assert saved is not None, "a rollback without a saved state"
        order = {slot: i for i, slot in enumerate(saved[0].tolist())}
        index = torch.tensor([order[slot] for slot in slots.tolist()], dtype=torch.long, device=slots.device)
        for t, copy in zip(self._tensors(), saved[1], strict=True):
            t.index_copy_(0, slots, copy[index])

    def _tensors(self) -> list[torch.Tensor]:
        return [*self.conv_caches, *self.recurrent_caches, self.last_hidden]

    def after_forward(self, plan: StatePlan, hidden: torch.Tensor) -> None:
        """Each committing sequence's last hidden row is kept in its slot."""
        if plan.last_rows.numel():
            self.last_hidden.index_copy_(0, plan.last_slots, hidden[plan.last_rows])
