"""Decoder: the base of every decoding rule a request can be resolved to, and what the step's decoding
(decoding/step_decoding.py) asks of it:

    read_positions   which canvas indices' logits the rule reads this step (the LM head runs only there)
    block_tokens     the tokens the step's blocks of this decoder feed the forward (their canvases; renoise canvases
                     at their first step are drawn, all at once)
    decode_blocks    the logit rows of a chunk's blocks of this decoder -> what each writes (and, for a
                     self-conditioned canvas that goes on, the logits its next step is conditioned on); by default
                     one `decode` per block, batched where the rule has a batched pass
    verify           drafted tokens checked against the causal rows that predict them (decoder=verified; a rule
                     that does not draft is never asked)
    release          forget a finished request's per-request state (canvases, grammar matchers, counts)

A decoder is resolved once per request (registry.py, which also validates the request against it) and shared by
every request it was resolved for; its per-request state is keyed by request id. A wrapper (decoding/wrapped.py:
penalties, grammar) is a decoder too, so a request's verification goes through its own wrappers as its decoding
does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask_policies import MASK_POLICIES, MaskPolicy
from diffuserve.sampling_params import ResolvedSamplingParams

if TYPE_CHECKING:
    from diffuserve.decoding.grammar_state import GrammarState


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class BlockDecode:
    """What one decoder returned for one block at one step."""

    write: BlockWrite
    self_conditioning: torch.Tensor | None = None
    """[C, V] the processed logits a self-conditioned canvas's next step reads; None otherwise (or when it ends)."""


class Decoder(ABC):
    name: str
    """The name a request asks for it by (or the rule's own, for the autoregressive rule)."""

    @abstractmethod
    def read_positions(self, request: Request) -> list[int]:
        """Canvas indices of the request's block whose logits this step reads, ascending."""

    def block_tokens(self, requests: list[Request], generators: RequestGenerators) -> list[list[int]]:
        """The tokens each request's block feeds this step's forward, in order: its canvas."""
        return [request.canvas for request in requests]

    @abstractmethod
    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        """rows [M, V] fp32: the block's logits at canvas `positions` -> what the step writes."""

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """rows [N, V] fp32: each block's logits at its `read_positions` (`positions`, as the step read them),
        request after request -> what each writes, as `decode` would."""
        decoded, start = [], 0
        for request, read in zip(requests, positions, strict=True):
            decoded.append(self.decode(request, rows[start : start + len(read)], read, generators))
            start += len(read)
        return decoded

    def verify(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        drafts: list[int],
        generators: RequestGenerators,
        grammar: GrammarState | None = None,
    ) -> Verification:
        """rows [M, V] fp32: the causal rows predicting the drafted absolute `positions` (ascending, consecutive),
        whose drafts are `drafts` -> what is kept (decoding/verified.py). `grammar`: the matcher the rows are
        masked by, fed each kept draft (set by the grammar wrapper)."""
        raise TypeError(f"the {self.name} decoder drafts nothing, so it verifies nothing")

    def proposal_params(self, request: Request) -> ResolvedSamplingParams:
        """The parameters the block's tokens are proposed with: the request's."""
        return request.params

    @property
    def walk_policy(self) -> MaskPolicy:
        """The policy a grammar walk decides the block's writes by (decoding/constrained.py): threshold for a rule
        that reads one position (any policy accepts it)."""
        return MASK_POLICIES["threshold"]

    def release(self, request_id: str) -> None:  # noqa: B027 (most decoders keep no per-request state)
        """Forgets the request's per-request state: none unless the decoder keeps some."""
