"""block_write: a proposal's tokens at the written canvas indices, as the host values a step returns."""

from __future__ import annotations

import torch

from diffuserve.core.request import BlockWrite
from diffuserve.decoding.logprobs import token_logprobs
from diffuserve.decoding.mask_policies import Proposal


def block_write(proposal: Proposal | None, indices: torch.Tensor) -> BlockWrite:
    """The proposal's tokens at canvas `indices` [W] (and their logprobs, if it has them) as host values."""
    if proposal is None or not indices.numel():
        return BlockWrite([])
    written, tokens = torch.stack([indices, proposal.tokens[indices]]).tolist()  # one transfer
    accepted = list(zip(written, tokens))
    if proposal.logprobs is None:
        return BlockWrite(accepted)
    return BlockWrite(accepted, token_logprobs(proposal.logprobs, proposal.tokens, indices))
