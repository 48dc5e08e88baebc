"""MaskDecoder: a masked block decoded by one of the mask policies (threshold, fixed, entropy, edit): propose a
token at each position read, let the policy decide which to write."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.mask_policies import MaskPolicy, propose
from diffuserve.decoding.protocol import BlockDecode
from diffuserve.sampling_params import ResolvedSamplingParams


class MaskDecoder:
    def __init__(self, name: str, policy: MaskPolicy, block_length: int) -> None:
        self.name, self.policy, self.block_length = name, policy, block_length

    def read_positions(self, request: Request) -> list[int]:
        return self.policy.logit_positions(
            request.masked_indices(), request.generation_start_in_block(), self.block_length
        )

    def block_tokens(self, request: Request, generators: RequestGenerators) -> list[int]:
        return request.canvas

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        params = self.draft_params(request)
        # The mask token keeps its logit: propose counts its mass and never proposes it.
        rows = forbid_tokens(request, positions, rows, forbid_mask=False)
        index = torch.tensor(positions, dtype=torch.long, device=rows.device)
        proposal = propose(
            rows,
            index,
            self.block_length,
            params,
            None if params.is_greedy else generators.of(request),
            self.policy.needs_entropy,
            params.logprobs,
            request.mask_token_id,
        )
        canvas = torch.tensor(request.canvas, device=rows.device)  # [B]
        write = self.policy.decide(
            proposal, canvas, canvas == request.mask_token_id, request.step_in_block, params, self.block_length
        )
        return BlockDecode(proposal.write(write.nonzero().flatten()))

    def draft_params(self, request: Request) -> ResolvedSamplingParams:
        """The parameters the block is proposed and decided with: the request's."""
        return request.params

    def release(self, request_id: str) -> None:
        """Nothing per request: the policy is stateless."""
