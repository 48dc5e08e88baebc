"""DraftState: what a verified request (decoder=verified or auto) knows about its drafts, in one object. Torch-free.

    positions  ... output_token_ids | tokens (the draft, committed, unverified) | the open block ...
                                     ^ block_start - len(tokens)              ^ block_start
    verified   every position below `end` holds a verified token: the prompt, the output, and the head of the
               draft or of the open block once written (its check ran in the step that wrote it)

Every request has one; only a verified request's ever holds tokens (the others' stays empty, so the geometry
that reads it, `Request.settled_end` and `known_tokens`, is the same for every decoder). How a forward's verdict
changes it is core/verification.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffuserve.core.outputs import TokenLogprobs


@dataclass
class DraftState:
    tokens: list[int] = field(default_factory=list)
    """The tokens of the last finished block, which the forward that commits them verifies. They follow the output
    and are committed like it, but are neither output nor used to stop until verified."""
    end: int = 0
    """Every position below it holds a verified token."""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With params.logprobs: those of the verified tokens not in the output yet (a block's or a draft's head),
    from the causal rows that verified them."""
    num_checked: int = 0
    """Drafted tokens checked against the causal path over the request's life, and of those, kept (`num_kept`)."""
    num_kept: int = 0
    num_draft_forwards: int = 0
    """Forwards its drafting took: one per draft checked, and one more after each rejection (the forward that
    commits the kept tokens again and decides the next head). Each decides one token beside the kept drafts."""
    backoff: int = 0
    """decoder=auto: how many steps the request decides only its head after its next draft while its drafts do
    not pay (doubled by each such draft in a row, reset once they do; core/draft_switch.py)."""
    skip: int = 0
    """decoder=auto: steps left in which the request decides only its head before it drafts again."""

    def start(self, block_start: int) -> int:
        """The position of the draft's first token, given the open block's start (the draft ends there)."""
        return block_start - len(self.tokens)
