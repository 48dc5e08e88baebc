"""The worker's side of verified decoding (decoding/verified.py): which rows of a step's forward predict a draft's
positions, the state slots saved before the forward that commits a draft and those rolled back after a rejection,
and the check of each block head the step writes. Knows no family: it reads causal rows under the AR shift (row
p - 1 predicts p), which the decoder registry requires of a model before it gives a request the verified decoder.

A request's draft [s, s + B) is verified by the step whose commit run starts at s (the scheduler commits a draft
from its own start); its head s was verified when it was written, so rows s .. s + B - 2, all commit rows of that
run, check positions s + 1 .. s + B - 1. Before that forward the slot's state (the state after s) is saved; if the
draft is rejected, the next forward first puts it back (worker/cache/state_step.py), so the GDN state and conv
ring end where the kept tokens start to be committed again. Attention K/V need no copy: the rejected positions are
written again before any query that may see them reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.core.verification import verify_start
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.decoding.generators import forbid_in_canvases
from diffuserve.worker.cache.state_step import state_slot

KEPT_HEAD = Verification(1, 1, None)
"""A head the check keeps, with no logprobs asked for."""


@dataclass(frozen=True)
class DraftRows:
    """Where the causal predictions of one request's drafted positions are."""

    work: ScheduledRequest
    positions: list[int]
    """The absolute positions verified."""
    rows: list[int]
    """The batch row predicting each."""


@dataclass
class StepDrafts:
    """A step's drafted blocks, as the batch is built."""

    drafts: list[DraftRows] = field(default_factory=list)

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        """`work`'s commit run starts at batch row `first_row`; records its draft if the run commits one."""
        request = work.request
        if work.commit_start != request.settled_end or work.commit_end < request.block_start:
            return
        positions = list(range(verify_start(request), request.block_start))
        self.drafts.append(DraftRows(work, positions, [first_row + p - 1 - work.commit_start for p in positions]))

    @property
    def slots(self) -> list[int]:
        """The state slots of the requests whose draft the step commits (saved before the forward)."""
        return [state_slot(d.work.request) for d in self.drafts]

    def rejected_slots(self, verdicts: dict[str, Verification]) -> list[int]:
        """The state slots of the drafts `verdicts` rejected (the next forward puts them back first)."""
        return [
            state_slot(d.work.request) for d in self.drafts if verdicts[d.work.request.request_id].token is not None
        ]

    def verify(
        self, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], decoding: BlockDecoding
    ) -> dict[str, Verification]:
        """After the forward: each draft checked by the verified decoder against the causal rows of `hidden`
        (the step's rows)."""
        index = torch.tensor([r for d in self.drafts for r in d.rows], dtype=torch.long, device=hidden.device)
        logits = compute_logits(hidden.index_select(0, index))
        verdicts, start = {}, 0
        for draft in self.drafts:
            request = draft.work.request
            block = logits[start : start + len(draft.positions)]
            start += len(draft.positions)
            offset = len(request.drafted) - (request.block_start - draft.positions[0])
            drafts = request.drafted[offset : offset + len(draft.positions)]
            verifier = decoding.registry.verified  # a request that drafts decodes with it (perhaps penalised)
            verdicts[request.request_id] = verifier.verify(request, block, draft.positions, drafts, decoding.generators)
        return verdicts


def check_heads(
    heads: list[tuple[Request, BlockWrite, int]], logits: torch.Tensor, decoding: BlockDecoding
) -> dict[str, BlockWrite]:
    """Verified requests' block writes (request, write, the row of `logits` [R, V] fp32 their block's first read
    position was read from: the last committed position's causal row) -> each write with its head checked where
    the step wrote the block's first position (and, where the check drew another token, that token written there
    instead). Greedy heads without logprobs, penalties or grammar are checked together, in one argmax over their
    rows (the mask token and, below min_tokens, the stop ids forbidden, as for any causal check); the others by the
    verified decoder, one by one."""
    checked: dict[str, BlockWrite] = {}
    plain: list[tuple[Request, BlockWrite, int, int]] = []  # (request, write, row, its head)
    for request, write, row in heads:
        head = next((token for index, token in write.accepted if index == 0), None)
        params = request.params
        if head is None:
            continue
        if params.is_greedy and params.logprobs is None and not params.has_penalties and not params.structured_outputs:
            plain.append((request, write, row, head))
            continue
        verdict = decoding.registry.verified.verify(
            request, logits[row : row + 1], [request.block_start], [head], decoding.generators
        )
        checked[request.request_id] = _with_head(write, verdict)
    if plain:
        index = torch.tensor([row for _, _, row, _ in plain], dtype=torch.long, device=logits.device)
        rows = forbid_in_canvases([r for r, _, _, _ in plain], logits.index_select(0, index)[:, None, :])
        for (request, write, _, head), best in zip(plain, rows[:, 0].argmax(dim=-1).tolist(), strict=True):
            checked[request.request_id] = _with_head(write, KEPT_HEAD if best == head else Verification(1, 0, best))
    return checked


def _with_head(write: BlockWrite, verdict: Verification) -> BlockWrite:
    """`write` carrying its head's check, the token the check wrote (if another) in place of the draft's."""
    if verdict.token is None:
        return replace(write, head=verdict)
    accepted = [(index, verdict.token if index == 0 else token) for index, token in write.accepted]
    return replace(write, accepted=accepted, head=verdict)
