"""Verified decoding's bookkeeping on a request (torch-free): applying what a forward found about its drafts.

A verified request's block is anchored right after its last verified token (core/request.py), so the block's
first position is always read from a causal row: the one of the last committed position. Two checks apply it:

    the head     the step that writes the block's first position checks that token against the causal row it was
                 read from (`apply_head`): it is verified at once, as autoregressive decoding would have decided it
                 in the same forward, so every forward that decodes a block decides at least one token
    the draft    a block whose masks are gone is a draft (`Request.draft`, core/draft_state.py); the forward
                 that commits it
                 compares the rest of it with the causal rows (decoding/verified.py), then, from
                 `verify_start(request)` on:

        all kept   the draft becomes output (streamed, used to stop); the next block, drafted in the same forward
                   (the fused commit), goes on, its head read from the draft's last causal row
        rejected   the kept head and the causal path's token at the first rejected position become output; the
                   next block opens right after them; the block step that assumed the draft is discarded and the
                   caches go back to the draft's start (the scheduler asks the cache manager; the state tensors
                   are restored by the worker), so the next forward commits the kept tokens again and reads the
                   next head from the last one's causal row
"""

from __future__ import annotations

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.core.writes import Verification


def verify_start(request: Request) -> int:
    """The first drafted position that is not verified yet (the draft's head was, when it was written)."""
    return max(request.draft.end, request.draft.start(request.block_start))


def checked_positions(work: ScheduledRequest) -> list[int]:
    """The drafted positions `work`'s commit verifies: those not verified yet of the request's draft, when the
    commit runs from the draft's start over the whole draft (the scheduler commits a draft from its own start);
    none otherwise."""
    request = work.request
    if not request.draft.tokens or work.commit_start != request.settled_end or work.commit_end < request.block_start:
        return []
    return list(range(verify_start(request), request.block_start))


def apply_head(request: Request, verdict: Verification) -> None:
    """The step wrote the open block's first position, checked by `verdict` against its causal row (at
    temperature > 0 the check may have drawn the token written). The position is verified, with its logprobs
    when the request asks."""
    request.draft.end = request.block_start + 1
    if request.params.logprobs is not None:
        request.draft.logprobs.extend(verdict.logprobs or [])


def end_at_head(request: Request) -> None:
    """The step decided only the open block's head (decoder=auto with drafts off, core/draft_switch.py), or the
    head is the whole block (block length 1): the verified head becomes output and the next block opens right
    after it, so the next forward commits the head and reads the next one from its causal row, as autoregressive
    decoding does."""
    _output(request, request.canvas[:1])
    request.open_block(request.block_start + 1)


def apply_verification(request: Request, verdict: Verification) -> bool:
    """Applies `verdict` to `request` (see the module docstring); returns whether the draft was rejected, so that
    the caches must go back to the draft's start, `request.block_start - block_length` before the call. With
    logprobs, the verified tokens' (the causal rows') follow them into the output."""
    draft = request.draft
    first = draft.start(request.block_start)  # the position of the draft's first token
    draft.num_checked += verdict.num_checked
    draft.num_kept += verdict.num_accepted
    if verdict.num_checked:
        draft.num_draft_forwards += 1 + (verdict.token is not None)
    if request.params.logprobs is not None:
        draft.logprobs.extend(verdict.logprobs or [])
    if verdict.token is None:
        _output(request, draft.tokens)
        draft.tokens, draft.end = [], request.block_start
        return False
    rejected = verify_start(request) + verdict.num_accepted
    _output(request, [*draft.tokens[: rejected - first], verdict.token])
    draft.tokens, draft.end = [], rejected + 1
    request.open_block(rejected + 1)
    return True


def _output(request: Request, tokens: list[int]) -> None:
    """Verified `tokens` join the output, with their logprobs."""
    request.output_token_ids.extend(tokens)
    request.output_logprobs.extend(request.draft.logprobs)
    request.draft.logprobs = []
