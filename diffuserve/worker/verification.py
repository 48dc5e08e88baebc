"""The worker's side of verified decoding (decoding/verified.py): which rows of a step's forward predict a drafted
block's positions, the state slots saved before the forward that commits a draft, and those rolled back after a
rejection. Knows no family: it reads the commit rows under the AR shift (row p - 1 predicts p), which the decoder
registry requires of a model before it gives a request the verified decoder.

A request's drafted block [s, s + B) is verified by the step whose commit run starts at s (the scheduler commits a
draft from its own block start): the row of position s - 1 is then the slot's kept row as it was before the
forward (copied before it, since the forward keeps the block's last row there), every later one a commit row.
Before that forward the slot's state (the state after s) is saved; if the draft is rejected, the next forward
first puts it back (worker/cache/state_step.py), so the GDN state and conv ring end where the kept tokens start
to be committed again. Attention K/V need no copy: the rejected positions are written again before any query
that may see them reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from diffuserve.core.step import ScheduledRequest
from diffuserve.core.verification import verify_start
from diffuserve.core.writes import Verification
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.worker.cache.state_step import state_slot


@dataclass(frozen=True)
class DraftRows:
    """Where the causal predictions of one request's drafted positions are."""

    work: ScheduledRequest
    positions: list[int]
    """The absolute positions verified."""
    rows: list[int]
    """The batch row predicting each; -1 - k: the k-th saved kept row (the row before the commit run)."""


@dataclass
class StepDrafts:
    """A step's drafted blocks, as the batch is built."""

    drafts: list[DraftRows] = field(default_factory=list)
    kept_slots: list[int] = field(default_factory=list)
    """The slots whose kept row (read before the forward) a draft's first position reads."""

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        """`work`'s commit run starts at batch row `first_row`; records its draft if the run commits one."""
        request = work.request
        if work.commit_start != request.settled_end or work.commit_end < request.block_start:
            return
        positions = list(range(verify_start(request), request.block_start))
        rows = [first_row + p - 1 - work.commit_start for p in positions]
        if positions[0] == work.commit_start:
            rows[0] = -1 - len(self.kept_slots)
            self.kept_slots.append(state_slot(request))
        self.drafts.append(DraftRows(work, positions, rows))

    @property
    def slots(self) -> list[int]:
        """The state slots of the requests whose draft the step commits (saved before the forward)."""
        return [state_slot(d.work.request) for d in self.drafts]

    def rejected_slots(self, verdicts: dict[str, Verification]) -> list[int]:
        """The state slots of the drafts `verdicts` rejected (the next forward puts them back first)."""
        return [
            state_slot(d.work.request) for d in self.drafts if verdicts[d.work.request.request_id].token is not None
        ]

    def kept_rows(self, carried: torch.Tensor) -> torch.Tensor:
        """Before the forward: a copy of the kept rows the drafts read ([K, H])."""
        index = torch.tensor(self.kept_slots, dtype=torch.long, device=carried.device)
        return carried.index_select(0, index)

    def verify(
        self,
        hidden: torch.Tensor,
        kept: torch.Tensor,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        decoding: BlockDecoding,
    ) -> dict[str, Verification]:
        """After the forward: each draft checked by its request's decoder against the causal rows of `hidden`
        (the step's rows) and `kept`."""
        if not self.drafts:
            return {}
        source = torch.cat([hidden, kept])
        rows = [r if r >= 0 else hidden.shape[0] - 1 - r for d in self.drafts for r in d.rows]
        logits = compute_logits(source.index_select(0, torch.tensor(rows, dtype=torch.long, device=hidden.device)))
        verdicts, start = {}, 0
        for draft in self.drafts:
            request = draft.work.request
            block = logits[start : start + len(draft.positions)]
            start += len(draft.positions)
            verifier = decoding.registry.verified  # a request that drafts decodes with it (perhaps penalised)
            verdicts[request.request_id] = verifier.verify(request, block, draft.positions, decoding.generators)
        return verdicts
