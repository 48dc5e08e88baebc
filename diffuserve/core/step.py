"""What the scheduler hands out and takes back each step, in terms of requests: the work it planned
(`SchedulerOutput` of `ScheduledRequest`s, with the state snapshots it takes), what the model runner computed
(`StepResult`: what it wrote into each block, prompt scores, grammar failures, verifications) and what applying
the step's results changed (`StepUpdate`). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification

if TYPE_CHECKING:
    from diffuserve.core.outputs import TokenLogprobs


@dataclass(frozen=True)
class StateSnapshot:
    """The request's recurrent state after `position` committed tokens, copied into `slot` during the step and
    registered under the page-chain hash of those tokens once the step is applied."""

    position: int
    slot: int
    prefix_hash: int


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class ScheduledRequest:
    """One request's work in a step: commit tokens [commit_start, commit_end), then optionally its block."""

    request: Request
    commit_start: int
    commit_end: int
    has_block: bool
    restore_from: int | None = None
    """Hybrid models: the prefix snapshot slot whose state the request's slot starts from (a prefix-cache hit)."""
    snapshot: StateSnapshot | None = None
    """Hybrid models: a prefix snapshot this step takes of the request's state."""
    move_from: int | None = None
    """Hybrid models: the slot the request's state moves out of this step, into its new `state_slot` (copied before
    the forward reads it), keeping running sequences in one range of slots (core/cache/recurrent.py)."""
    score_start: int = 0
    score_end: int = 0
    """Prompt positions [score_start, score_end) this step scores, each by a variant of its block (B tokens
    beside the request's own queries; worker/prompt_scoring.py)."""
    head_only: bool = False
    """decoder=auto in a step where drafts are off (core/draft_switch.py): only the block's head is decided, then
    committed like an autoregressive token; the block is not computed (`forwards_block` False)."""
    forwards_block: bool = True
    """Whether the block's tokens are query rows of the forward. False where no row of the block is ever read: a
    one-token block of a model that predicts position p from row p - 1 (autoregressive decoding), whose logits
    come from the last committed row. Such a block is decoded without being computed."""

    @property
    def query_start(self) -> int:
        return self.commit_start

    @property
    def query_end(self) -> int:
        return self.request.block_end if self.has_block and self.forwards_block else self.commit_end

    @property
    def num_tokens(self) -> int:
        """The request's own query tokens (commits and, when computed, the block)."""
        forwarded = self.has_block and self.forwards_block
        end = self.request.block_end if forwarded else self.commit_end  # query_end, inlined: a hot path
        return end - self.commit_start

    @property
    def num_score_tokens(self) -> int:
        """Query tokens of this step's scoring variants."""
        return (self.score_end - self.score_start) * self.request.block_length


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request] = field(default_factory=list)
    num_batched_tokens: int = field(init=False)
    """Query tokens of the step, counted when it is scheduled (applying its results moves the blocks on)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_batched_tokens", sum(s.num_tokens + s.num_score_tokens for s in self.scheduled))

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class StepResult:
    """What the model runner computed in one step."""

    writes: dict[str, BlockWrite] = field(default_factory=dict)
    """Per request id with a block: what the step writes into it."""
    prompt_scores: dict[str, list[tuple[int, TokenLogprobs]]] = field(default_factory=dict)
    """Per request id scoring its prompt: (prompt position, logprobs) of the positions scored this step."""
    failures: dict[str, str] = field(default_factory=dict)
    """Per request id whose grammar failed while decoding: the message; the engine fails those requests alone."""
    verifications: dict[str, Verification] = field(default_factory=dict)
    """Per request id whose drafted block this step committed: what verifying it found (decoder=verified)."""
    phase_seconds: tuple[float, float, float] | None = None
    """Wall seconds of building the batch, the forward, and decoding (engine/step_phases.py); None from a runner
    that does not time them."""


@dataclass
class StepUpdate:
    """A step's results as applied by `Scheduler.update_from_output`."""

    requests: list[Request] = field(default_factory=list)
    """Every request of the step, in schedule order (finished ones included)."""
    new_token_counts: dict[str, int] = field(default_factory=dict)
    """Per request id, tokens that became final this step."""
    finished: list[Request] = field(default_factory=list)
    """Requests this step finished on a stop id or on length (their pages are already free)."""
    finished_blocks: list[str] = field(default_factory=list)
    """Ids of requests whose block became final this step and that go on with the next block."""
    num_prefill_tokens: int = 0
    """Prompt tokens whose K/V this step computed."""
    num_generated_tokens: int = 0
    num_draft_tokens: int = 0
    """Verified decoding: drafted tokens this step's commits checked ..."""
    num_accepted_tokens: int = 0
    """... the ones kept ..."""
    num_verified_blocks: int = 0
    """... in this many drafted blocks"""
    num_discarded_steps: int = 0
    """Block steps fused with a draft that was rejected, thrown away."""
