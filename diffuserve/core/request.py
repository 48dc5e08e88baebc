"""A request's life in the engine: status, the current diffusion block ("canvas"), and when it is finished.

Torch-free. The engine's geometry, for prompt length P and block length B (blocks aligned to position 0):

    positions  0 ............ P-1 | P ............................
    blocks     [ B ][ B ][ B ][ prompt tail + masks ][ masks ] ...
               <- committed KV -->|<- block_start      (canvas = the current block, B tokens)

A renoise canvas (decoder=renoise, DiffusionGemma) and a verified draft (decoder=verified, Clover) are anchored at
the committed length instead: prefill commits the whole prompt, the first block covers [P, P + B) and each next one
starts where the last one's kept tokens end. A renoise canvas's positions hold the canvas the decoder drew (random
tokens, never masks) and are decided only when the decoder ends it; a verified draft starts right after the last
verified token (core/verification.py), so its first position is always read from a causal row.

`num_computed_tokens` counts positions whose final K/V are in the cache; positions in
[num_computed_tokens, block_start) are known tokens still to commit (prompt blocks, or the block finished in
the previous step: the fused commit). Accepted tokens never change unless the decoder edits (LLaDA2.1): then
they are provisional until the block is final, and neither committed nor used to stop before that.

A request that asks for logprobs keeps, per canvas position, those of the step that last wrote it, and per
output token those of its final value (`output_logprobs`, aligned with `output_token_ids`).

A request that records its denoising (`params.record_denoising`) keeps, per step, the output positions the step
wrote and their tokens (`denoising_steps`): what a client needs to watch a block settle.

A request says when its tokens end it (`stop_check`: a stop id or the length) but never finishes itself: its
status moves to a finished one only in `Scheduler.finish_requests`.

What a step hands out and takes back is core/step.py's; what it writes into a block, core/writes.py's.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diffuserve.core.adapter_ref import AdapterRef
from diffuserve.core.block_rules import MaskedBlocks, rule_for
from diffuserve.core.draft_state import DraftState
from diffuserve.core.outputs import DenoisingStep
from diffuserve.sampling_params import ResolvedSamplingParams

if TYPE_CHECKING:
    from diffuserve.core.outputs import TokenLogprobs


LAST_UNFINISHED_STATUS = 2
"""RequestStatus.PREEMPTED's value: every later status is final."""


class RequestStatus(enum.IntEnum):
    """Ordered: every status after PREEMPTED is final."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def is_finished(self) -> bool:
        # Compared as ints: an enum comparison costs several times more, read several times per request-step.
        return self._value_ > LAST_UNFINISHED_STATUS

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's names."""
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(self)


@dataclass(frozen=True)
class TokenStop:
    """How a request's tokens end it: the final status, the answer (cut at the stop id or max_tokens) and the
    stop id that ended it (None for length)."""

    status: RequestStatus
    token_ids: list[int]
    stop_reason: int | None


@dataclass(eq=False)  # a request is an entity: the scheduler's `in` / `remove` compare identity, not every field
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: ResolvedSamplingParams
    block_length: int
    mask_token_id: int
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    """Generated tokens of finished blocks (and, once finished, the final answer)."""
    canvas: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With params.logprobs: the logprobs of each output token (empty otherwise)."""
    canvas_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    """With params.logprobs: per canvas position, the logprobs of the step that last wrote it (empty otherwise)."""
    block_start: int = 0
    step_in_block: int = 0
    num_post_edit_steps: int = 0
    """Steps the current block took with no mask left (decoder=edit)."""
    block_is_final: bool = False
    """The canvas can no longer change: the block may be committed and its tokens used to stop."""
    num_computed_tokens: int = 0
    pages: dict[str, list[int]] = field(default_factory=dict)
    """Per page group (core/cache/paged.py): the request's page table."""
    page_hashes: list[int] = field(default_factory=list)
    """Prefix-cache hashes of this request's leading full, committed pages."""
    adapter: AdapterRef | None = None
    """The LoRA adapter the request runs with (None: the base model)."""
    state_slot: int | None = None
    """The recurrent-state slot the request holds while running (models with a RecurrentState cache)."""
    canvas_slot: int | None = None
    """The canvas slot the request holds while running (models with a CanvasState: renoise canvases)."""
    num_forwards: int = 0
    first_token_time: float | None = None
    """time.monotonic() when the step that decided its first output token was applied."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at the request's first admission."""
    last_scheduled_step: int = -1
    score_cursor: int = 1
    """With params.prompt_logprobs: the next prompt position to score (position 0 has no score)."""
    score_pages: dict[str, list[int]] = field(default_factory=dict)
    """Per page group: pages lent to this step's scoring variants for their K/V (scratch, never cached); freed
    with the step."""
    stop_reason: int | str | None = None
    error: str | None = None
    denoising_steps: list[DenoisingStep] = field(default_factory=list)
    """With params.record_denoising: every denoising step's writes, oldest first (empty otherwise)."""
    num_stop_scanned: int = 0
    """Leading output tokens `stop_check` has scanned: none of them ends the request."""
    draft: DraftState = field(default_factory=DraftState)
    """Verified decoding's drafts (core/draft_state.py; empty for every other decoder)."""
    rule: MaskedBlocks = field(init=False, repr=False)
    """How the request's blocks live for its decoder kind (core/block_rules.py): the request delegates every
    decoder-specific choice to it."""
    num_prompt_tokens: int = field(init=False)
    num_prefill_positions: int = field(init=False)
    """The prompt's complete blocks: the positions prefill computes (the tail is denoised with the block); the
    whole prompt before an anchored block. (Both fixed at creation, as the prompt and the rule are: the step reads
    them many times per request.)"""

    def __post_init__(self) -> None:
        self.rule = rule_for(self.params)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        whole_blocks = self.num_prompt_tokens // self.block_length * self.block_length
        self.num_prefill_positions = self.num_prompt_tokens if self.rule.anchored else whole_blocks
        self.draft.end = self.num_prompt_tokens
        self.open_block(self.num_prefill_positions)

    # ---- geometry ------------------------------------------------------------------------------------------
    @property
    def page_ids(self) -> list[int]:
        """The full-attention page table (page i holds positions [i * page_size, (i + 1) * page_size))."""
        return self.pages.get("kv", [])

    @property
    def score_page_ids(self) -> list[int]:
        return self.score_pages.get("kv", [])

    @property
    def is_anchored(self) -> bool:
        """Whether blocks start at the committed length (renoise canvases, verified drafts), not on the grid."""
        return self.rule.anchored

    @property
    def block_end(self) -> int:
        return self.block_start + self.block_length

    @property
    def num_unscored(self) -> int:
        """Prompt positions still to score (0 when the request does not score its prompt)."""
        if self.params.prompt_logprobs is None:
            return 0
        return max(0, self.num_prompt_tokens - self.score_cursor)

    @property
    def settled_end(self) -> int:
        """Positions before it hold tokens no verification can take back: the current block's start, or while a
        drafted block waits for verification, that block's start."""
        return self.block_start - self.block_length if self.draft.tokens else self.block_start

    @property
    def commit_target(self) -> int:
        """Where commits run to: the current block (a drafted block is committed in a forward of its own start,
        whose state verification can roll back to); with max_tokens 0 (no block) only the blocks that prompt
        scoring reads, those before the last prompt position's block."""
        if self.params.max_tokens > 0:
            settled = self.settled_end  # read once: this runs several times per request-step
            return settled if self.num_computed_tokens < settled else self.block_start
        return (self.num_prompt_tokens - 1) // self.block_length * self.block_length if self.num_unscored else 0

    def known_tokens(self, start: int, end: int) -> list[int]:
        """Final tokens at positions [start, end) < block_start (prompt, then finished blocks)."""
        if end <= start:  # a step without commits asks for none: no copy of the whole sequence
            return []
        prompt, output = self.prompt_token_ids, self.output_token_ids
        num_prompt = len(prompt)
        if end <= num_prompt:
            return prompt[start:end]
        # sliced piece by piece: joining the whole sequence first would copy it at every step (O(length))
        lo, hi = max(start - num_prompt, 0), end - num_prompt
        tokens = prompt[start:] + output[lo:hi] if start < num_prompt else output[lo:hi]
        if hi > len(output):
            tokens += self.draft.tokens[max(lo - len(output), 0) : hi - len(output)]
        return tokens

    def open_block(self, block_start: int) -> None:
        """Starts a new current block at `block_start`: known prompt tail, masks elsewhere (a renoise canvas: mask
        ids as placeholders until its first step draws it)."""
        self.block_start = block_start
        tail = self.prompt_token_ids[block_start:]
        self.canvas = tail + [self.mask_token_id] * (self.block_length - len(tail))
        if self.params.logprobs is not None:
            self.canvas_logprobs = [None] * self.block_length
        self.step_in_block = 0
        self.num_post_edit_steps = 0
        self.block_is_final = False

    def masked_indices(self) -> list[int]:
        return [i for i, token in enumerate(self.canvas) if token == self.mask_token_id]

    def generation_start_in_block(self) -> int:
        """Index in the canvas of the first generated position (> 0 only in the prompt's last block)."""
        return max(0, self.num_prompt_tokens - self.block_start)

    # ---- progress ------------------------------------------------------------------------------------------
    def apply_step(
        self, accepted: list[tuple[int, int]], logprobs: list[TokenLogprobs] | None = None, final: bool | None = None
    ) -> None:
        """Writes a step's (canvas index, token) pairs (and, when asked for, their `logprobs`, in the same order)
        and decides `block_is_final`: no mask left, and either the post-edit budget (`params.post_edit_budget`, 0
        unless the decoder edits) is spent or this step began with no mask and changed nothing. Without editing, a
        block is thus final once its masks are gone. A renoise canvas is final when the decoder says so (`final`)."""
        had_masks = self.mask_token_id in self.canvas
        if not had_masks:
            self.num_post_edit_steps += 1
        changed = False
        for index, token in accepted:
            changed |= self.canvas[index] != token
            self.canvas[index] = token
        if logprobs is not None:
            for (index, _), entry in zip(accepted, logprobs, strict=True):
                self.canvas_logprobs[index] = entry
        if self.params.record_denoising:
            self._record_step(accepted)
        self.block_is_final = self.rule.is_final(self, had_masks, changed, final)

    def _record_step(self, accepted: list[tuple[int, int]]) -> None:
        """Keeps the step's writes in output positions (canvas index i is output position block_start + i - P)."""
        offset = self.block_start - self.num_prompt_tokens
        self.denoising_steps.append(
            DenoisingStep(
                block=(self.block_start - self.num_prefill_positions) // self.block_length,
                step=self.step_in_block,
                start=max(0, offset),
                end=offset + self.block_length,
                writes=tuple((offset + index, token) for index, token in accepted),
            )
        )

    def stop_check(self) -> TokenStop | None:
        """After a step: whether the tokens end the request, by a stop id with everything before it decided, or
        by length (every position below max_tokens decided); None if not (yet). Tokens of a block that may still
        be edited (or a renoise canvas still being denoised) count as undecided. Changes nothing the scheduler
        sees (it applies the result); it remembers how many output tokens it has scanned, so that a step scans
        only the tokens it has not seen (output tokens never change), not the whole output."""
        params = self.params
        decided, limit = self.output_token_ids, params.max_tokens
        tail = self.canvas[self.generation_start_in_block() :]
        tail = self.rule.decided_tail(self, tail)
        for g in range(min(self.num_stop_scanned, len(decided)), min(len(decided), limit)):
            if decided[g] in params.stop_ids and g >= params.min_tokens:
                return TokenStop(RequestStatus.FINISHED_STOPPED, decided[: g + 1], decided[g])
        self.num_stop_scanned = len(decided)
        offset = len(decided)
        for i, token in enumerate(tail[: max(limit - offset, 0)]):
            if token == self.mask_token_id:
                return None
            if token in params.stop_ids and offset + i >= params.min_tokens:
                return TokenStop(RequestStatus.FINISHED_STOPPED, decided + tail[: i + 1], token)
        if offset + len(tail) >= limit:
            return TokenStop(RequestStatus.FINISHED_LENGTH, (decided + tail)[:limit], None)
        return None

    def apply_stop(self, stop: TokenStop) -> None:
        """The tokens end the request: the output becomes `stop`'s answer (its logprobs with it)."""
        undecided = self.rule.undecided_logprobs(self)
        if undecided or self.output_logprobs:
            self.output_logprobs = (self.output_logprobs + undecided)[: len(stop.token_ids)]
        self.output_token_ids, self.stop_reason = stop.token_ids, stop.stop_reason

    def finish_block(self) -> list[int]:
        """The block is final and the request goes on: its generated part leaves it (as output, or under verified
        decoding as a draft, `draft`, until the forward that commits it verifies it; either way committed by the
        next forward) and the next block opens. Returns the tokens that became output."""
        new = self.rule.finish_block(self, self.canvas[self.generation_start_in_block() :])
        self.open_block(self.block_end)
        return new

    def generated_logprobs(self) -> list[TokenLogprobs]:
        """The logprobs of the block's generated positions, up to the first one never written (a mask)."""
        entries = self.canvas_logprobs[self.generation_start_in_block() :]
        written = next((i for i, entry in enumerate(entries) if entry is None), len(entries))
        return [entry for entry in entries[:written] if entry is not None]

    def total_tokens_needed(self) -> int:
        """Positions the request can ever occupy (its rule's say: see core/block_rules.py)."""
        return self.rule.total_tokens_needed(self)
