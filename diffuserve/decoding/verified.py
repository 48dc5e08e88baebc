"""VerifiedDecoder (decoder=verified): a block is drafted by the threshold policy, greedily, and the forward that
commits it verifies the draft against the model's causal path, whose row before each position predicts it (the
AR shift), so the output is the model's autoregressive output: token-identical to greedy autoregressive decoding
at temperature 0, distributed exactly as autoregressive sampling otherwise (same temperature, top-k, top-p).

    temperature 0   keep drafted tokens while they equal the causal argmax; at the first that does not, the
                    argmax is written instead and the rest of the block is drafted again
    temperature > 0 speculative sampling with a point-mass draft q = 1[x]: keep x with probability
                    min(1, p(x) / q(x)) = p(x); on rejection draw from the normalised residual (p - q)+, which is
                    p without x. A sampled draft would need its q row ([V] floats) kept per drafted position
                    until the commit; the greedy draft needs nothing kept

Why that is exact: at each position the kept token is x with probability p(x) and any other y with probability
(1 - p(x)) * p(y) / (1 - p(x)) = p(y). Which positions are compared and what happens to the request afterwards is
core/verification.py's; which rows the commit forward gives is the worker's (worker/verification.py).
"""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import ThresholdDecoder, filter_logits
from diffuserve.decoding.penalties import PenaltyCounts, apply_penalties
from diffuserve.sampling_params import VERIFIED, ResolvedSamplingParams


class VerifiedDecoder(MaskDecoder):
    def __init__(self, block_length: int, penalty_counts: PenaltyCounts | None = None) -> None:
        super().__init__(VERIFIED, ThresholdDecoder(), block_length)
        self.penalty_counts = penalty_counts if penalty_counts is not None else PenaltyCounts()
        """The counts the drafts were penalised with (the registry's): the causal rows get the same."""

    def draft_params(self, request: Request) -> ResolvedSamplingParams:
        """Drafts are greedy whatever the request's temperature (q is then a point mass: nothing to keep)."""
        return request.params.replace(temperature=0.0)

    def verify(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> Verification:
        """rows [M, V] fp32: the causal path's predictions of the drafted absolute `positions` (ascending, from
        `verify_start`) -> how many drafts are kept and the token at the first rejected position."""
        drafts = request.drafted[len(request.drafted) - (request.block_start - positions[0]) :]
        offsets = [p - request.block_start for p in positions]  # canvas indices relative to the open block
        rows = forbid_tokens(request, offsets, rows)
        params = request.params
        if params.has_penalties:  # the same counts as the drafts': the committed output before the block
            rows = apply_penalties(rows, self.penalty_counts.of(request, rows.shape[-1], rows.device), params)
        if params.is_greedy:
            target = rows.argmax(dim=-1).tolist()
            for i, (draft, token) in enumerate(zip(drafts, target, strict=False)):
                if draft != token:
                    return Verification(len(positions), i, token)
            return Verification(len(positions), len(positions), None)
        probs = torch.softmax(filter_logits(rows / params.temperature, params.top_k, params.top_p), dim=-1)
        generator = generators.of(request)
        for i, draft in enumerate(drafts[: len(positions)]):
            keep = torch.rand((), generator=generator, device=rows.device) < probs[i, draft]
            if not keep:
                residual = probs[i].clone()
                residual[draft] = 0.0
                token = torch.multinomial(residual, 1, generator=generator).item()
                return Verification(len(positions), i, int(token))
        return Verification(len(positions), len(positions), None)
