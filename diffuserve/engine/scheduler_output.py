"""What the scheduler hands out and takes back each step: the work it planned (`SchedulerOutput`) and what
applying the step's results changed (`StepUpdate`). Plain data, torch-free; the scheduler fills both."""

from __future__ import annotations

from dataclasses import dataclass, field

from diffuserve.engine.request import Request


@dataclass(frozen=True)
class StateSnapshot:
    """The request's recurrent state after `position` committed tokens, copied into `slot` during the step and
    registered under the page-chain hash of those tokens once the step is applied."""

    position: int
    slot: int
    prefix_hash: int


@dataclass(frozen=True)
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

    @property
    def query_start(self) -> int:
        return self.commit_start

    @property
    def query_end(self) -> int:
        return self.request.block_end if self.has_block else self.commit_end

    @property
    def num_tokens(self) -> int:
        return self.query_end - self.query_start


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request] = field(default_factory=list)
    num_batched_tokens: int = field(init=False)
    """Query tokens of the step, counted when it is scheduled (applying its results moves the blocks on)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_batched_tokens", sum(s.num_tokens for s in self.scheduled))

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


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
