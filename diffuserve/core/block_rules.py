"""How a block lives on a request, per decoder kind: the torch-free rules `Request` delegates to, so that the
request itself never asks which decoder it has. One stateless rule per kind (`rule_for`); a request's per-request
state stays on the request (its canvas, its `DraftState`).

    rule       where its blocks start     when a block is final              what a finished block becomes
    masked     on the grid (multiples     no mask left                       output
               of B from position 0)
    editing    on the grid                no mask left and the post-edit     output (its tokens undecided, for
                                          budget spent, or a step changed    stopping, until then)
                                          nothing
    canvas     at the committed length    when the decoder says (renoise)    output (undecided until then)
    verified   right after the last       no mask left                       a draft, verified by the forward
               verified token                                                that commits it (only verified
                                                                             tokens stop the request)

What a decoder computes is decoding/'s; what verification does to a draft, core/verification.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from diffuserve.core.draft_state import DraftState
from diffuserve.sampling_defaults import AUTO, RENOISE, VERIFIED
from diffuserve.sampling_params import ResolvedSamplingParams

if TYPE_CHECKING:
    from diffuserve.core.outputs import TokenLogprobs


class Request(Protocol):
    """The request as its rule reads and changes it (core/request.py's `Request`, which imports this module)."""

    params: ResolvedSamplingParams
    block_length: int
    mask_token_id: int
    canvas: list[int]
    canvas_logprobs: list[TokenLogprobs | None]
    output_token_ids: list[int]
    output_logprobs: list[TokenLogprobs]
    num_post_edit_steps: int
    block_is_final: bool
    draft: DraftState

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_prefill_positions(self) -> int: ...

    def generated_logprobs(self) -> list[TokenLogprobs]: ...


class MaskedBlocks:
    """Masked blocks on the grid, final once their masks are gone (threshold, fixed, entropy, autoregressive)."""

    anchored = False
    """Whether blocks start at the committed length (prefill commits the whole prompt), not on the grid."""
    verifies_heads = False
    """Whether the step that writes a block's first position checks it against the causal row it was read from."""

    def is_final(self, request: Request, had_masks: bool, changed: bool, final: bool | None) -> bool:
        """After a step wrote the block (`had_masks`: the canvas had a mask before it; `changed`: it changed a
        token; `final`: the decoder's own say, for canvases): whether the block can no longer change."""
        if request.mask_token_id in request.canvas:  # a proposal may be the mask token itself
            return False
        settled = not had_masks and not changed
        return settled or request.num_post_edit_steps >= request.params.post_edit_budget

    def decided_tail(self, request: Request, tail: list[int]) -> list[int]:
        """The open block's generated tokens as stopping may read them (a mask: not decided yet)."""
        return tail

    def undecided_logprobs(self, request: Request) -> list[TokenLogprobs]:
        """The logprobs of the tokens after the output that a stop may take into it."""
        return request.generated_logprobs() if request.canvas_logprobs else []

    def finish_block(self, request: Request, new: list[int]) -> list[int]:
        """The block's generated tokens `new` leave it (the next block opens after); returns those that became
        output."""
        request.output_token_ids.extend(new)
        if request.canvas_logprobs:
            request.output_logprobs.extend(request.generated_logprobs())
        return new

    def total_tokens_needed(self, request: Request) -> int:
        """Positions the request can ever occupy: its last block ends at or after prompt + max_tokens."""
        start = request.num_prefill_positions
        end = request.num_prompt_tokens + request.params.max_tokens
        return start + -(-(end - start) // request.block_length) * request.block_length


class EditedBlocks(MaskedBlocks):
    """decoder=edit: accepted tokens may change until the block is final, so they stop nothing before that."""

    def decided_tail(self, request: Request, tail: list[int]) -> list[int]:
        return tail if request.block_is_final else [request.mask_token_id] * len(tail)


class Canvases(EditedBlocks):
    """decoder=renoise: random-token canvases anchored at the committed length, ended by the decoder."""

    anchored = True

    def is_final(self, request: Request, had_masks: bool, changed: bool, final: bool | None) -> bool:
        return bool(final)


class VerifiedDrafts(MaskedBlocks):
    """decoder=verified or auto: blocks anchored right after the last verified token; a finished block is a draft
    (`Request.draft`) until the forward that commits it verifies it; only verified tokens are decided."""

    anchored = True
    verifies_heads = True

    def decided_tail(self, request: Request, tail: list[int]) -> list[int]:
        verified = request.draft.end - request.num_prompt_tokens - len(request.output_token_ids)
        return [*(request.draft.tokens + tail)[:verified], request.mask_token_id]

    def undecided_logprobs(self, request: Request) -> list[TokenLogprobs]:
        return request.draft.logprobs  # the causal rows'

    def finish_block(self, request: Request, new: list[int]) -> list[int]:
        request.draft.tokens = new
        return []

    def total_tokens_needed(self, request: Request) -> int:
        """A draft may start at the last token the request needs, so it may end B - 1 positions past it."""
        return request.num_prompt_tokens + request.params.max_tokens - 1 + request.block_length


MASKED, EDITED, CANVASES, VERIFIED_DRAFTS = MaskedBlocks(), EditedBlocks(), Canvases(), VerifiedDrafts()


def rule_for(params: ResolvedSamplingParams) -> MaskedBlocks:
    """The block rule of a request decoded with `params` (its decoder already resolved for the model)."""
    if params.decoder == RENOISE:
        return CANVASES
    if params.decoder in (VERIFIED, AUTO):
        return VERIFIED_DRAFTS
    return EDITED if params.is_editing else MASKED
