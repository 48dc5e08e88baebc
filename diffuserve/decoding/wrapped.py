"""WrappedDecoder: the base of a decoder that processes the rows another decoder reads (penalties.py's
`Penalized`, constrained.py's `GrammarConstrained`) and otherwise is that decoder: the same positions, tokens,
proposal parameters and per-request state. A wrapper processes the rows of both of its inner decoder's reads:
`decode` (a block's rows) and `verify` (a draft's causal rows), so a verified request's checks see the rows its
drafts saw, processed the same way. Knows nothing of what the processing is.
"""

from __future__ import annotations

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask_policies import MaskPolicy
from diffuserve.decoding.protocol import Decoder
from diffuserve.sampling_params import ResolvedSamplingParams


class WrappedDecoder(Decoder):
    def __init__(self, inner: Decoder) -> None:
        self.inner = inner
        self.name = inner.name

    def read_positions(self, request: Request) -> list[int]:
        return self.inner.read_positions(request)

    def block_tokens(self, requests: list[Request], generators: RequestGenerators) -> list[list[int]]:
        return self.inner.block_tokens(requests, generators)

    def proposal_params(self, request: Request) -> ResolvedSamplingParams:
        return self.inner.proposal_params(request)

    @property
    def walk_policy(self) -> MaskPolicy:
        return self.inner.walk_policy

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)
