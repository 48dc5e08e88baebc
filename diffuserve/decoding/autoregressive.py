"""NextTokenDecoder: the autoregressive rule, for a model read through its causal path (no block-diffusion
tensors): one token a step, the block's first masked position, sampled from its row (temperature, top-k,
top-p)."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.mask_policies import propose
from diffuserve.decoding.protocol import BlockDecode, Decoder


class NextTokenDecoder(Decoder):
    name = "autoregressive"

    def __init__(self, block_length: int) -> None:
        self.block_length = block_length

    def read_positions(self, request: Request) -> list[int]:
        return request.masked_indices()[:1]

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        """rows [1, V] predicts canvas position `positions[0]`, which the step writes."""
        rows = forbid_tokens(request, positions, rows)
        index = torch.tensor(positions, device=rows.device)
        generator = generators.for_sampling(request)
        proposal = propose(
            rows, index, self.block_length, request.params, generator, num_logprobs=request.params.logprobs
        )
        return BlockDecode(proposal.write(index))
