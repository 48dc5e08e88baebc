"""GrammarConstrained: a decoder wrapped so that every accepted token extends a valid prefix of the request's
grammar (`structured_outputs`): the inner decoder says which positions are read; the grammar walk
(grammar_walk.py) proposes and accepts them left to right. A mask decoder proposes with its `draft_params` (a
verified request's drafts: greedy, their causal check grammar-masked by decoding/verified.py) and decides with its
policy; the autoregressive rule reads one position, which any policy accepts (the threshold policy's is used)."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import MASK_POLICIES
from diffuserve.decoding.protocol import BlockDecode, Decoder


class GrammarConstrained:
    def __init__(self, inner: Decoder, structured: StructuredDecoding, block_length: int) -> None:
        self.inner, self.structured, self.block_length = inner, structured, block_length
        self.name = inner.name

    def read_positions(self, request: Request) -> list[int]:
        return self.inner.read_positions(request)

    def block_tokens(self, request: Request, generators: RequestGenerators) -> list[int]:
        return self.inner.block_tokens(request, generators)

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        rows = forbid_tokens(request, positions, rows)
        params, policy = (
            (self.inner.draft_params(request), self.inner.policy)
            if isinstance(self.inner, MaskDecoder)
            else (request.params, MASK_POLICIES["threshold"])
        )
        generator = None if params.is_greedy else generators.of(request)
        proposal, written = self.structured.decode(
            request, rows, positions, generator, self.block_length, params, policy
        )
        if proposal is None:  # the matcher failed: nothing written, the failure reported (take_failures)
            return BlockDecode(BlockWrite([]))
        return BlockDecode(proposal.write(torch.tensor(written, dtype=torch.long, device=rows.device)))

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)
        self.structured.release(request_id)
