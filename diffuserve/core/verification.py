"""Verified decoding's bookkeeping on a request (torch-free): applying what the forward that committed a drafted
block found (`core/request.py:Verification`).

A request decoding with decoder=verified finishes a block as a draft (`Request.drafted`); the next forward commits
it through the model's causal path, whose rows predict each next position, and the request's decoder compares
(decoding/verified.py). Then, for the drafted positions from `verify_start(request)` on:

    all kept   the draft becomes output (streamed, used to stop); the next block, denoised in the same forward
               (the fused commit), goes on
    rejected   the kept head and the causal path's token at the first rejected position stay; the block reopens
               with them known and the rest masked (or, if that fills it, is final and is committed again); the
               next block's step is discarded, and the caches go back to the block's start (the scheduler asks the
               cache manager; the state tensors are restored by the worker)
"""

from __future__ import annotations

from diffuserve.core.request import Request
from diffuserve.core.writes import Verification


def verify_start(request: Request) -> int:
    """The first drafted position that is not verified yet (earlier ones were, before the block was redrafted)."""
    return max(request.verified_end, request.block_start - len(request.drafted))


def apply_verification(request: Request, verdict: Verification) -> bool:
    """Applies `verdict` to `request` (see the module docstring); returns whether the draft was rejected, so that
    the caches must go back to the drafted block's start, `request.block_start - block_length` before the call.
    With logprobs, the verified tokens' (the causal rows') follow them: into the output with them, or kept in
    `verified_logprobs` while they head a reopened block."""
    first = request.block_start - len(request.drafted)  # the position of drafted[0]
    if request.params.logprobs is not None:
        request.verified_logprobs.extend(verdict.logprobs or [])
    if verdict.token is None:
        _output(request, request.drafted)
        request.drafted, request.verified_end = [], request.block_start
        return False
    rejected = verify_start(request) + verdict.num_accepted
    kept = [*request.drafted[: rejected - first], verdict.token]
    block = request.block_start - request.block_length
    request.drafted, request.verified_end = [], rejected + 1
    if rejected + 1 == request.block_start:  # the block is whole and verified: final, committed again
        _output(request, kept)
        request.open_block(request.block_start)
        return True
    request.open_block(block)
    request.canvas[first - block : rejected + 1 - block] = kept
    return True


def _output(request: Request, tokens: list[int]) -> None:
    """Verified `tokens` join the output, with their logprobs."""
    request.output_token_ids.extend(tokens)
    request.output_logprobs.extend(request.verified_logprobs)
    request.verified_logprobs = []
