"""Mask policies: from logits at a block's positions to a proposal (`propose`: temperature, top-k, top-p, a
per-request seeded generator), and which proposed positions of a block to write at a step (`MaskPolicy.decide`:
threshold, fixed, entropy, edit). Pure functions over tensors. A policy is not a `Decoder` (decoding/protocol.py):
the mask decoder (decoding/mask.py) runs one per block.

Every tensor here is canvas-shaped, [B] for one request's current block of B positions. A proposal carries, at
each position the policy asked logits for (`logit_positions`: the masked ones, and for the edit policy also
the accepted generated ones), the token the model proposes (never the mask token) and its confidence (the
probability of that token under the sampling distribution; at temperature 0 the softmax of the whole vocabulary,
the mask token's mass included, as in the references) and entropy, and for a request that asks for logprobs
the token's logprob and its top alternatives (decoding/logprobs.py); other positions hold -inf confidence and +inf
entropy, so they are never chosen. `torch.topk` runs over the whole block exactly as the SDAR / LLaDA2
references run it, so ties break the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import torch

from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.logprobs import LogprobRows, logprob_rows, token_logprobs
from diffuserve.sampling_defaults import MASK_DECODER_NAMES
from diffuserve.sampling_params import ResolvedSamplingParams


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor
    """[B] long: proposed token at masked positions (undefined elsewhere)."""
    confidence: torch.Tensor
    """[B] fp32: probability of the proposed token; -inf where not masked."""
    entropy: torch.Tensor | None
    """[B] fp32: entropy of the position's distribution (nats); +inf where not masked. None unless needed."""
    logprobs: LogprobRows | None = None
    """The proposed tokens' logprobs and top alternatives; None unless the request asks for logprobs."""

    @property
    def num_masked(self) -> int:
        return int(torch.isfinite(self.confidence).sum())

    def only(self, positions: torch.Tensor) -> Proposal:
        """The proposal restricted to the [B] bool `positions` (confidence -inf, entropy +inf elsewhere)."""
        confidence = self.confidence.masked_fill(~positions, float("-inf"))
        entropy = None if self.entropy is None else self.entropy.masked_fill(~positions, float("inf"))
        return Proposal(self.tokens, confidence, entropy, self.logprobs)

    def write(self, indices: torch.Tensor) -> BlockWrite:
        """The proposed tokens at canvas `indices` [W] (and their logprobs, if it has them) as host values."""
        if not indices.numel():
            return BlockWrite([])
        written, tokens = torch.stack([indices, self.tokens[indices]]).tolist()  # one transfer
        accepted = list(zip(written, tokens))
        if self.logprobs is None:
            return BlockWrite(accepted)
        return BlockWrite(accepted, token_logprobs(self.logprobs, self.tokens, indices))


class HasThreshold(Protocol):
    """What the threshold rule reads of a request's parameters (a batch's: a [R, 1] tensor, one per row)."""

    @property
    def threshold(self) -> float | torch.Tensor: ...


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [M, V] -> logits with -inf outside the top-k and outside the smallest nucleus of mass top_p
    (the first token past top_p is kept, as transformers and the LLaDA2 reference do)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cumulative > top_p
        remove[:, 1:] = remove[:, :-1].clone()  # shift right: keep the token that crosses top_p
        remove[:, 0] = False
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return logits


def propose(
    logits: torch.Tensor,
    positions: torch.Tensor,
    block_length: int,
    params: ResolvedSamplingParams,
    generator: torch.Generator | None,
    need_entropy: bool = False,
    num_logprobs: int | None = None,
    mask_token_id: int | None = None,
) -> Proposal:
    """logits [M, V] fp32 at canvas indices `positions` [M] -> canvas-shaped Proposal [B].

    temperature 0: the argmax of the logits (lowest index on ties) and its probability under the softmax over
    the whole vocabulary; otherwise a multinomial draw from the tempered, filtered distribution and that
    distribution's probability of the drawn token. `num_logprobs` (not None): also the tokens' logprobs under
    the proposing distribution, with that many top alternatives.

    `mask_token_id` (not None): `logits` still hold the mask token's logit and the mask token is never proposed
    (a position given it would stay masked). At temperature 0 its probability still counts, as in the LLaDA2 and
    SDAR references' softmax: the confidence and entropy are those of the whole vocabulary's distribution, and a
    row whose argmax is the mask token proposes its best other token. Sampled, and in the logprobs, the mask
    token has probability 0 (the distribution renormalised without it).
    """
    if mask_token_id is not None and not 0 <= mask_token_id < logits.shape[-1]:
        mask_token_id = None  # outside the LM head's vocabulary: never proposed anyway
    if params.is_greedy:
        scores = logits
        probs = torch.softmax(scores, dim=-1)  # [M, V], the mask token included
        tokens = best_token(scores, mask_token_id)
        if mask_token_id is not None and num_logprobs is not None:
            scores = _without(scores, mask_token_id)  # logprobs: the mask token at probability 0
    else:
        tempered = logits / params.temperature
        if mask_token_id is not None:
            tempered[:, mask_token_id] = float("-inf")  # our own copy: never drawn
        scores = filter_logits(tempered, params.top_k, params.top_p)
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    confidence = probs.gather(-1, tokens[:, None]).squeeze(-1)
    canvas_tokens = torch.zeros(block_length, dtype=torch.long, device=logits.device)
    canvas_conf = torch.full((block_length,), float("-inf"), device=logits.device)
    canvas_tokens[positions], canvas_conf[positions] = tokens, confidence
    entropy = None
    if need_entropy:
        entropy = torch.full((block_length,), float("inf"), device=logits.device)
        entropy[positions] = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    logprobs = None
    if num_logprobs is not None:
        log_probs = torch.log_softmax(scores, dim=-1)
        logprobs = logprob_rows(log_probs, tokens, positions, block_length, num_logprobs)
    return Proposal(canvas_tokens, canvas_conf, entropy, logprobs)


def best_token(logits: torch.Tensor, never: int | None) -> torch.Tensor:
    """logits [M, V] -> [M] long: each row's argmax, or, where that is the token `never`, the row's best other
    token; the lowest token id on ties, as `argmax` (the references' pick) breaks them."""
    best = logits.argmax(dim=-1)
    if never is None:
        return best
    hits = (best == never).nonzero().flatten()  # rows ranking `never` first: practically none for a trained model
    if len(hits):
        others = logits[hits]  # a copy of those rows only
        others[:, never] = float("-inf")
        best[hits] = others.argmax(dim=-1)
    return best


def _without(logits: torch.Tensor, token: int) -> torch.Tensor:
    """A copy of logits [M, V] with `token` at -inf."""
    return logits.index_fill(-1, torch.tensor([token], device=logits.device), float("-inf"))


def num_transfer_tokens(block_length: int, steps: int, step: int) -> int:
    """Even split of the block over `steps`, remainder to the first steps (SDAR and LLaDA2 schedules)."""
    return block_length // steps + (1 if step < block_length % steps else 0)


def top_k_mask(confidence: torch.Tensor, k: int) -> torch.Tensor:
    """[B] bool with the k most confident positions set (k clamped to the masked count)."""
    k = min(k, int(torch.isfinite(confidence).sum()))
    accept = torch.zeros_like(confidence, dtype=torch.bool)
    accept[torch.topk(confidence, k).indices] = True
    return accept


class MaskPolicy(ABC):
    """A denoising policy. `select` returns the [B] bool mask of masked positions whose proposal is accepted;
    `decide` the positions written this step (by default the same: accepted tokens never change)."""

    needs_entropy = False
    edits = False
    """Whether the policy rewrites decided tokens (it reads the block's canvas, not only its masked positions)."""

    @abstractmethod
    def select(
        self, proposal: Proposal, step: int, params: ResolvedSamplingParams, block_length: int
    ) -> torch.Tensor: ...

    def logit_positions(self, masked: list[int], first_generated: int, block_length: int) -> list[int]:
        """Canvas indices whose logits this policy reads (the LM head runs only there): the masked ones."""
        return masked

    def decide(
        self,
        proposal: Proposal,
        canvas: torch.Tensor,
        masked: torch.Tensor,
        step: int,
        params: ResolvedSamplingParams,
        block_length: int,
    ) -> torch.Tensor:
        """[B] bool: positions whose proposed token is written this step. `canvas` [B] long holds the block's
        tokens before the step and `masked` [B] bool marks its mask tokens."""
        return self.select(proposal, step, params, block_length)

    @staticmethod
    def min_count(step: int, params: ResolvedSamplingParams, block_length: int) -> int:
        return num_transfer_tokens(block_length, params.steps or block_length, step)


class ThresholdPolicy(MaskPolicy):
    """Accept every proposal with confidence > threshold (strict); if fewer than the schedule's count for this
    step, accept the schedule's count of most confident ones instead (SDAR `low_confidence_dynamic`, LLaDA2)."""

    def select(self, proposal: Proposal, step: int, params: ResolvedSamplingParams, block_length: int) -> torch.Tensor:
        count = self.min_count(step, params, block_length)
        above = self.passes(proposal.confidence, params)
        return above if int(above.sum()) >= count else top_k_mask(proposal.confidence, count)

    def passes(self, confidence: torch.Tensor, params: HasThreshold) -> torch.Tensor:
        """[B] (or [R, B] against [R, 1] thresholds: mask_batch.py) bool: the proposals strictly above the
        threshold, compared in the confidence's dtype (a Python float threshold is rounded to it)."""
        return confidence > params.threshold


class FixedStepsPolicy(MaskPolicy):
    """Accept exactly the schedule's count of most confident proposals (LLaDA / SDAR `low_confidence_static`)."""

    def select(self, proposal: Proposal, step: int, params: ResolvedSamplingParams, block_length: int) -> torch.Tensor:
        return top_k_mask(proposal.confidence, self.min_count(step, params, block_length))


class EntropyBoundPolicy(MaskPolicy):
    """EB-sampler: sort masked positions by entropy (ascending) and accept the longest prefix whose entropy sum,
    less its largest member, stays within gamma = `entropy_bound`; always at least one position."""

    needs_entropy = True

    def select(self, proposal: Proposal, step: int, params: ResolvedSamplingParams, block_length: int) -> torch.Tensor:
        assert proposal.entropy is not None, "the entropy policy needs proposal entropies"
        num_masked = proposal.num_masked
        order = torch.sort(proposal.entropy, stable=True).indices[:num_masked]
        sorted_entropy = proposal.entropy[order]
        excess = torch.cumsum(sorted_entropy, 0) - sorted_entropy  # sum of the set minus its largest member
        count = max(1, int((excess <= params.entropy_bound).sum()))
        accept = torch.zeros_like(proposal.confidence, dtype=torch.bool)
        accept[order[:count]] = True
        return accept


class EditPolicy(ThresholdPolicy):
    """LLaDA2.1 token editing (SGLang `JointThreshold`, diffusers' LLaDA2 block refinement), two rules per step:

    mask-to-token: the threshold policy over the masked positions (`threshold`, top-k fallback);
    token-to-token: every accepted generated position (never the prompt's tail) whose newly proposed token
    differs from its current one with confidence > `edit_threshold` is rewritten.

    When the block is final (no masks, and a step that changed nothing or `max_post_edit_steps` spent) is the
    request's business (`Request.apply_step`); until then the engine keeps the block open and uncommitted.
    """

    edits = True

    def logit_positions(self, masked: list[int], first_generated: int, block_length: int) -> list[int]:
        return list(range(first_generated, block_length))

    def decide(
        self,
        proposal: Proposal,
        canvas: torch.Tensor,
        masked: torch.Tensor,
        step: int,
        params: ResolvedSamplingParams,
        block_length: int,
    ) -> torch.Tensor:
        fill = self.select(proposal.only(masked), step, params, block_length)
        # Prompt positions have no proposal (-inf), so they never pass the threshold.
        edit = ~masked & (proposal.tokens != canvas) & (proposal.confidence > params.edit_threshold)
        return fill | edit


MASK_POLICIES: dict[str, MaskPolicy] = dict(
    zip(
        MASK_DECODER_NAMES,
        (ThresholdPolicy(), FixedStepsPolicy(), EntropyBoundPolicy(), EditPolicy()),
        strict=True,
    )
)
"""The policy of each mask decoder (sampling_defaults.MASK_DECODER_NAMES), in its order; the renoise decoder's
canvases are decoding/renoise.py's."""
