"""The denoising trace's record of a verified draft (decoder=verified, `SamplingParams.record_denoising`): which
drafted tokens the commit forward's causal check kept, which it rejected and the causal token written at the
first rejection, as a `DenoisingStep` with a `DraftCheck`, so that a client watching the blocks settle (the web
console's denoising view) sees rejected drafts as such.

Recorded before the verdict is applied (core/verification.py then moves the kept tokens to the output and
opens the next block after them); knows nothing of how the causal rows were compared (decoding/verified.py).
"""

from __future__ import annotations

from diffuserve.core.outputs import DenoisingStep, DraftCheck
from diffuserve.core.request import Request
from diffuserve.core.verification import verify_start
from diffuserve.core.writes import Verification


def record_check(request: Request, verdict: Verification) -> None:
    """Appends the check of `request`'s drafted block to its denoising trace (the draft still pending)."""
    drafted = request.draft.tokens
    first = request.draft.start(request.block_start)  # the absolute position of drafted[0]
    start = verify_start(request)
    offset = request.num_prompt_tokens  # absolute position -> output position
    checked = [(p - offset, drafted[p - first]) for p in range(start, start + verdict.num_checked)]
    accepted, rejected = checked[: verdict.num_accepted], checked[verdict.num_accepted :]
    causal = None if verdict.token is None else (rejected[0][0], verdict.token)
    block_start = request.block_start - request.block_length
    block = (block_start - request.num_prefill_positions) // request.block_length
    drafting = [s.step for s in request.denoising_steps if s.start == block_start - offset and s.check is None]
    request.denoising_steps.append(
        DenoisingStep(
            block=block,
            step=(drafting[-1] if drafting else 0) + 1,
            start=max(0, block_start - offset),
            end=block_start - offset + request.block_length,
            writes=tuple(accepted) + ((causal,) if causal else ()),
            check=DraftCheck(accepted=tuple(accepted), rejected=tuple(rejected), causal=causal),
        )
    )
