"""The step's checks of verified requests (decoder=verified or auto), each through the request's own decoder
(`Decoder.verify`: its penalty and grammar wrappers process the causal rows as they processed its drafts):

    drafts   each draft the step commits, against the causal rows of the commit (`check_drafts`): plain greedy
             drafts (no logprobs, penalties or grammar) all at once (draft_checks.py), the others one by one
    heads    each block head the step writes, against the causal row it was read from (`check_heads`): plain
             heads (no logprobs, penalties or grammar) all at once (head_checks.py), the others one by one

What the verdicts do to a request is core/verification.py's; which rows hold the predictions, the runner's.
"""

from __future__ import annotations

import itertools

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding import draft_checks
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.head_checks import PlainHead, check_plain_heads, with_head
from diffuserve.decoding.step_decoding import PlannedBlock, PlannedDraft


def check_drafts(
    drafts: list[PlannedDraft], logits: torch.Tensor, generators: RequestGenerators
) -> dict[str, Verification]:
    """logits [D, V] fp32: the causal rows predicting every draft's checked positions, drafts one after another
    -> each request's verdict, in the drafts' order: the plain greedy drafts all at once (draft_checks.py), the
    others one by one."""
    starts = list(itertools.accumulate((len(draft.positions) for draft in drafts), initial=0))
    plain = [(draft, start) for draft, start in zip(drafts, starts) if draft_checks.is_plain_greedy(draft)]
    together = draft_checks.check_greedy_drafts(plain, logits) if plain else {}
    verdicts = {}
    for draft, start in zip(drafts, starts):
        request_id = draft.request.request_id
        if request_id in together:
            verdicts[request_id] = together[request_id]
            continue
        rows = logits[start : start + len(draft.positions)]
        verdicts[request_id] = draft.decoder.verify(draft.request, rows, draft.positions, draft.drafts, generators)
    return verdicts


def check_heads(
    heads: list[tuple[PlannedBlock, BlockWrite, int]], logits: torch.Tensor, generators: RequestGenerators
) -> dict[str, BlockWrite]:
    """Verified requests' block writes (block, write, the row of `logits` [R, V] fp32 their first read position
    was read from: the last committed position's causal row) -> each write with its head checked where the step
    wrote the block's first position (and, where the check drew another token, that token written there
    instead). The mask token and, below min_tokens, the stop ids are forbidden, as for any causal check."""
    for block, _, _ in heads:  # generators made in the heads' order, as checking them one by one makes them
        if not block.request.params.is_greedy:
            generators.of(block.request)
    checked: dict[str, BlockWrite] = {}
    plain: list[PlainHead] = []
    for block, write, row in heads:
        request = block.request
        head = next((token for index, token in write.accepted if index == 0), None)
        if head is None:  # a grammar failure wrote nothing
            continue
        if _is_plain(request):
            plain.append(PlainHead(request, write, row, head))
            continue
        verdict = block.decoder.verify(request, logits[row : row + 1], [request.block_start], [head], generators)
        checked[request.request_id] = with_head(write, verdict)
    if plain:
        checked |= check_plain_heads(plain, logits, generators)
    return checked


def _is_plain(request: Request) -> bool:
    """Whether the head's check is its row's alone, with no logprobs, penalties or grammar: the argmax (greedy) or
    the speculative-sampling check (sampled), which `check_plain_heads` runs for all such heads at once."""
    params = request.params
    return params.logprobs is None and not params.has_penalties and not params.structured_outputs
