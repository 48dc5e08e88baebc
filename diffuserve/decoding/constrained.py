"""GrammarConstrained: a decoder wrapped so that every accepted token extends a valid prefix of the request's
grammar (`structured_outputs`): the inner decoder says which positions are read; the grammar walk
(grammar_walk.py) proposes them with the inner decoder's proposal parameters (a verified request's drafts:
greedy) and accepts them left to right by its policy (the autoregressive rule reads one position, which any
policy accepts). A draft's causal check (decoder=verified) runs with the request's matcher, synced to the verified
tokens before the checked positions (rolling back the drafted block the next block's walk fed it) and fed each
draft as it is kept, so a rejected suffix is never in it."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.grammar_batch import walk_blocks
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.mask_policies import Proposal
from diffuserve.decoding.protocol import BlockDecode, Decoder
from diffuserve.decoding.wrapped import WrappedDecoder


class GrammarConstrained(WrappedDecoder):
    def __init__(self, inner: Decoder, structured: StructuredDecoding, block_length: int) -> None:
        super().__init__(inner)
        self.structured, self.block_length = structured, block_length

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        rows = forbid_tokens(request, positions, rows)
        params = self.inner.proposal_params(request)
        generator = None if params.is_greedy else generators.of(request)
        proposal, written = self.structured.decode(
            request, rows, positions, generator, self.block_length, params, self.inner.walk_policy
        )
        return self._written(proposal, written, rows.device)

    @staticmethod
    def _written(proposal: Proposal | None, written: list[int], device: torch.device) -> BlockDecode:
        if proposal is None:  # the matcher failed: nothing written, the failure reported (take_failures)
            return BlockDecode(BlockWrite([]))
        return BlockDecode(proposal.write(torch.tensor(written, dtype=torch.long, device=device)))

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """Each block's rows forbidden as `decode` forbids them, then their walks in lockstep (grammar_batch.py);
        the entropy policy's one by one on a GPU (mask.py batches it on the CPU only, for the same reason)."""
        if self.inner.walk_policy.needs_entropy and rows.device.type != "cpu":
            return super().decode_blocks(requests, rows, positions, generators)
        params = [self.inner.proposal_params(r) for r in requests]
        for request, p in zip(requests, params, strict=True):
            if not p.is_greedy:  # generators made in request order, as block-by-block decoding makes them
                generators.of(request)
        start = 0
        for request, read in zip(requests, positions, strict=True):
            forbid_tokens(request, read, rows[start : start + len(read)])  # a view: edits the block's own rows
            start += len(read)
        walked = walk_blocks(
            self.structured, requests, rows, positions, params, self.inner.walk_policy, generators, self.block_length
        )
        return [self._written(proposal, written, rows.device) for proposal, written in walked]

    def verify(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        drafts: list[int],
        generators: RequestGenerators,
        grammar: GrammarState | None = None,
    ) -> Verification:
        state = self.structured.state_of(request)
        first = request.draft.start(request.block_start)  # the position of the draft's first token
        state.sync(request.output_token_ids + request.draft.tokens[: positions[0] - first])
        try:
            return self.inner.verify(request, rows, positions, drafts, generators, state)
        except RuntimeError as e:  # the matcher failed: the request fails alone (take_failures), as when drafting
            self.structured.fail(request, e)
            return Verification(len(positions), len(positions), None)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)
        self.structured.release(request_id)
