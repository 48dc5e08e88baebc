"""What a step writes into a request's block (`BlockWrite`) and what verifying a drafted block found
(`Verification`): the values the model runner hands back per request. Torch-free; knows nothing of requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffuserve.core.outputs import TokenLogprobs


@dataclass(frozen=True)
class Verification:
    """What checking drafted positions against the causal rows that predict them found (decoder=verified;
    core/verification.py)."""

    num_checked: int
    """Drafted positions compared, from `verify_start(request)` on (or the block's head)."""
    num_accepted: int
    """The leading ones kept."""
    token: int | None
    """The causal path's token at the first rejected position; None when every checked position was kept."""
    logprobs: list[TokenLogprobs] | None = None
    """For a request that asks for logprobs: those of the kept drafts, then of `token`, from the causal rows."""


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class BlockWrite:
    """What a step writes into one request's block."""

    accepted: list[tuple[int, int]]
    """(canvas index, token) pairs."""
    logprobs: list[TokenLogprobs] | None = None
    """For a request that asks for logprobs: each written token's, in the order of `accepted`."""
    final: bool | None = None
    """A renoise canvas: whether this step ended it (its tokens are then the written ones); None for the other
    decoders, whose blocks end when their masks are gone."""
    head: Verification | None = None
    """A verified draft whose first position this step wrote: that token checked against the causal row it was
    read from (core/verification.py: `apply_head`); None otherwise."""
