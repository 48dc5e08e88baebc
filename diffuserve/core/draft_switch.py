"""decoder=auto: in which steps its requests draft. Torch-free.

An auto request is a verified request (its tokens are the model's autoregressive ones) whose drafts the engine
turns off while the batch is wide. A drafting request puts about 2 x block_length query tokens into a step (its
draft's commit and its next block) for up to block_length tokens decided; one that decides only its block's head
(read from the last committed position's causal row) puts in one (the head before it, committed), for one token,
as autoregressive decoding does. While forwards cost about the same whatever their width (a GPU's memory-bound
regime, or a CPU step dominated by its fixed cost), drafting wins; once the step's tokens set its cost, it does not.

The rule has two parts:

    the batch     the auto requests draft in a step while all of them drafting puts at most `max_draft_tokens`
                  tokens into it (`--auto-draft-tokens`): auto requests running or admissible (and not backing
                  off) x 2 x block_length <= max_draft_tokens
    the request   its drafting decides 1 + kept / forwards tokens per forward (each of its drafting forwards
                  decides one token beside the drafts it keeps: DraftState.num_draft_forwards), in forwards of a
                  draft's width, each costing `draft_cost` autoregressive ones (about 1.9 on a CPU at batch 1,
                  measured; about 1 on a GPU, whose forward hardly grows with its width: an estimate). While that
                  yield is not above the cost, each checked draft makes the request decide only its head for
                  `backoff` steps (1, doubled by each such draft in a row, at most MAX_BACKOFF) before it drafts
                  again; once its drafts pay, the backoff resets. Drafts that never pay (random weights, prompts
                  far from the drafts' training, a CPU's cost for drafts the model gets half right) thus cost one
                  drafting step in MAX_BACKOFF + 1, and one unlucky draft among good ones costs nothing

Either way every token is checked against the causal path, so the choice changes the speed, never the output.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diffuserve.core.draft_state import DraftState
from diffuserve.core.request import Request
from diffuserve.core.writes import Verification

MAX_BACKOFF = 32
"""The most steps an auto request decides only its head between two drafts that do not pay."""
CPU_DRAFT_COST = 1.9
"""A drafting forward's time over an autoregressive one's at batch 1 on a CPU, a block's commit and preview against
one token: the bundled model's 208 against 112 forwards/s in the run it was taken from (git eef70bc), 259 against
143 (1.8) in docs/results/compare-verified.json."""
GPU_DRAFT_COST = 1.0
"""The same on a GPU, below GPU_DRAFT_TOKENS a step's time barely grows with its width. An estimate: no GPU was
lent to measure it."""
GPU_DRAFT_TOKENS = 512
"""The default on a GPU: a step's tokens up to which a forward of a 3B-active MoE stays bound by reading its
weights rather than by computing (an H100's 3.35 TB/s against its 990 TFLOP/s at about 6 GFLOP per token: some
hundreds of tokens), so drafts cost little. An estimate: no GPU was lent to measure it."""


def default_draft_cost(device_type: str) -> float:
    """A drafting forward's cost in autoregressive forwards on `device_type` (a torch device type)."""
    return GPU_DRAFT_COST if device_type == "cuda" else CPU_DRAFT_COST


def default_draft_tokens(device_type: str, block_length: int) -> int:
    """`--auto-draft-tokens`' default on `device_type` (a torch device type): on a CPU a step's cost grows with its
    tokens from the first (measured on the bundled model: one request drafting beats autoregressive decoding on
    its tasks' prompts, sixteen do not: docs/benchmarks/decoders.md), so one request's draft, 2 x block_length."""
    return GPU_DRAFT_TOKENS if device_type == "cuda" else 2 * block_length


@dataclass
class DraftSwitch:
    block_length: int
    max_draft_tokens: int
    draft_cost: float = CPU_DRAFT_COST
    """A drafting forward's cost in autoregressive forwards (`default_draft_cost`)."""
    drafting: bool = True
    """This step's choice."""
    num_drafting_steps: int = 0
    """Steps with auto requests in which they drafted ..."""
    num_autoregressive_steps: int = 0
    """... and in which they decided their next token only."""

    def choose(self, requests: Iterable[Request]) -> None:
        """Sets `drafting` for the step about to be scheduled from the auto requests among `requests` (those
        running and those it may admit)."""
        num_auto = sum(1 for request in requests if request.params.is_auto and not request.draft.skip)
        self.drafting = num_auto * 2 * self.block_length <= self.max_draft_tokens
        if num_auto:
            if self.drafting:
                self.num_drafting_steps += 1
            else:
                self.num_autoregressive_steps += 1

    def lets_draft(self, request: Request) -> bool:
        """Whether the auto request `request` drafts in this step (the batch's choice, and its own backoff)."""
        return self.drafting and not request.draft.skip


def back_off(draft: DraftState, verdict: Verification, draft_cost: float) -> None:
    """After a draft's check (counted in `draft` already): while the request's drafting decides no more tokens per
    forward than `draft_cost` (1 + kept / forwards <= cost), the check doubles its backoff and starts it; once it
    decides more, the backoff resets."""
    pays = draft.num_kept > (draft_cost - 1) * draft.num_draft_forwards
    if verdict.num_checked and not pays:
        draft.backoff = min(max(1, 2 * draft.backoff), MAX_BACKOFF)
        draft.skip = draft.backoff
    else:
        draft.backoff = 0
