"""The step's checks of verified requests (decoder=verified or auto), each through the request's own decoder
(`Decoder.verify`: its penalty and grammar wrappers process the causal rows as they processed its drafts):

    drafts   each draft the step commits, against the causal rows of the commit (`check_drafts`)
    heads    each block head the step writes, against the causal row it was read from (`check_heads`): greedy
             plain heads (no logprobs, penalties or grammar) in one argmax over their rows, the others one by one

What the verdicts do to a request is core/verification.py's; which rows hold the predictions, the runner's.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_in_canvases
from diffuserve.decoding.step_decoding import PlannedBlock, PlannedDraft

KEPT_HEAD = Verification(1, 1, None)
"""A head the check keeps, with no logprobs asked for."""


def check_drafts(
    drafts: list[PlannedDraft], logits: torch.Tensor, generators: RequestGenerators
) -> dict[str, Verification]:
    """logits [D, V] fp32: the causal rows predicting every draft's checked positions, drafts one after another
    -> each request's verdict."""
    verdicts, start = {}, 0
    for draft in drafts:
        rows = logits[start : start + len(draft.positions)]
        start += len(draft.positions)
        verdict = draft.decoder.verify(draft.request, rows, draft.positions, draft.drafts, generators)
        verdicts[draft.request.request_id] = verdict
    return verdicts


def check_heads(
    heads: list[tuple[PlannedBlock, BlockWrite, int]], logits: torch.Tensor, generators: RequestGenerators
) -> dict[str, BlockWrite]:
    """Verified requests' block writes (block, write, the row of `logits` [R, V] fp32 their first read position
    was read from: the last committed position's causal row) -> each write with its head checked where the step
    wrote the block's first position (and, where the check drew another token, that token written there
    instead). The mask token and, below min_tokens, the stop ids are forbidden, as for any causal check."""
    checked: dict[str, BlockWrite] = {}
    plain: list[tuple[Request, BlockWrite, int, int]] = []  # (request, write, row, its head)
    for block, write, row in heads:
        request = block.request
        head = next((token for index, token in write.accepted if index == 0), None)
        if head is None:  # a grammar failure wrote nothing
            continue
        if _is_plain(request):
            plain.append((request, write, row, head))
            continue
        verdict = block.decoder.verify(request, logits[row : row + 1], [request.block_start], [head], generators)
        checked[request.request_id] = _with_head(write, verdict)
    if plain:
        index = torch.tensor([row for _, _, row, _ in plain], dtype=torch.long, device=logits.device)
        rows = forbid_in_canvases([r for r, _, _, _ in plain], logits.index_select(0, index)[:, None, :])
        for (request, write, _, head), best in zip(plain, rows[:, 0].argmax(dim=-1).tolist(), strict=True):
            checked[request.request_id] = _with_head(write, KEPT_HEAD if best == head else Verification(1, 0, best))
    return checked


def _is_plain(request: Request) -> bool:
    """Whether the head's check is the row's argmax alone (its decoder's `verify` would compute just that)."""
    params = request.params
    return params.is_greedy and params.logprobs is None and not params.has_penalties and not params.structured_outputs


def _with_head(write: BlockWrite, verdict: Verification) -> BlockWrite:
    """`write` carrying its head's check, the token the check wrote (if another) in place of the draft's."""
    if verdict.token is None:
        return replace(write, head=verdict)
    accepted = [(index, verdict.token if index == 0 else token) for index, token in write.accepted]
    return replace(write, accepted=accepted, head=verdict)
