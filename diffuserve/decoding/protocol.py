"""The Decoder protocol: what the model runner asks of a request's decoding rule, once per block per step.

    read_positions   which canvas indices' logits the rule reads this step (the LM head runs only there)
    block_tokens     the tokens the block feeds the forward (its canvas; a renoise canvas's first step draws it)
    decode           the logit rows [M, V] at those indices -> what the step writes (and, for a self-conditioned
                     canvas that goes on, the logits its next step is conditioned on)
    release          forget a finished request's per-request state (canvases, grammar matchers)

A `BatchDecoder` also decodes many blocks in one call (`decode_blocks`: the renoise decoder, whose blocks all read
every position, and the mask decoders, whose greedy blocks decode in one pass); the runner hands it all of its
blocks of a logits chunk at once.

A decoder is resolved once per request (registry.py, which also validates the request against it) and shared by
every request it was resolved for; its per-request state is keyed by request id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators


@dataclass(frozen=True)
class BlockDecode:
    """What one decoder returned for one block at one step."""

    write: BlockWrite
    self_conditioning: torch.Tensor | None = None
    """[C, V] the processed logits a self-conditioned canvas's next step reads; None otherwise (or when it ends)."""


class Decoder(Protocol):
    name: str
    """The name a request asks for it by (or the rule's own, for the autoregressive rule)."""

    def read_positions(self, request: Request) -> list[int]:
        """Canvas indices of the request's block whose logits this step reads, ascending."""
        ...

    def block_tokens(self, request: Request, generators: RequestGenerators) -> list[int]:
        """The tokens the request's block reads this step."""
        ...

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        """rows [M, V] fp32: the block's logits at canvas `positions` -> what the step writes."""
        ...

    def release(self, request_id: str) -> None:
        """Forgets the request's per-request state, if any."""
        ...


class BatchDecoder(Decoder, Protocol):
    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """rows [N, V] fp32: each block's logits at its `read_positions` (`positions`, as the step read them),
        request after request (for renoise canvases, which read every position, [B x block_length, V]) -> what each
        writes, as `decode` would."""
        ...
