"""Mask decoding of many blocks in one vectorised pass: the common case of the threshold, fixed, entropy and edit
policies (greedy or sampled, with or without logprobs), which `MaskDecoder.decode_blocks` hands here instead of
decoding block by block; the proposals themselves are propose_batch.py's. Knows the policies' rules, not which
requests qualify (mask.py decides that).

Every block's rows are its read positions' logits (the masked ones; with the edit policy also the generated ones),
ascending, request after request; the blocks are laid out as
canvases [R, B] (B the block length), -inf confidence and +inf entropy at positions not read, so each row holds
exactly the tensor a per-request `propose` builds for that block. Each policy's rule is then applied to all rows
at once with the per-request path's own operations, row-wise (`topk` on each row with that row's k, a stable sort,
a sequential cumsum), so ties break as they do there; mask_policies.py stays the one statement of the rules, and
tests/decoding/test_mask_batch.py checks this module against it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask_policies import (
    EditPolicy,
    EntropyBoundPolicy,
    FixedStepsPolicy,
    MaskPolicy,
    ThresholdPolicy,
)
from diffuserve.decoding.propose_batch import propose_rows, written_logprobs
from diffuserve.sampling_params import ResolvedSamplingParams


def decode_common_blocks(
    policy: MaskPolicy,
    requests: list[Request],
    params: list[ResolvedSamplingParams],
    rows: torch.Tensor,
    positions: list[list[int]],
    generators: RequestGenerators,
) -> list[BlockWrite]:
    """rows [N, V] fp32: the blocks' logits at their read `positions` (masked canvas indices: all of them, or a
    verified block's head alone), request after request (the mask token's logit kept, as `propose` wants it) ->
    each request's write, equal to the per-request decode's: greedy or sampled, with their logprobs where asked
    (propose_batch.py)."""
    block_length, device = requests[0].block_length, rows.device
    mask_token_id = requests[0].mask_token_id  # the caller passes one mask token's blocks
    num_read = [len(read) for read in positions]
    assert sum(num_read) == rows.shape[0], "one logits row per read position"
    flat = [r * block_length + i for r, read in enumerate(positions) for i in read]
    read = torch.tensor(flat, dtype=torch.long, device=device)  # [N] flat canvas index of each row, in order
    never = mask_token_id if 0 <= mask_token_id < rows.shape[-1] else None
    ends = list(itertools.accumulate(num_read))
    spans = [(end - count, end) for end, count in zip(ends, num_read, strict=True)]
    proposals = propose_rows(rows, requests, params, spans, generators, never, policy.needs_entropy)
    shape = (len(requests), block_length)
    proposed = torch.zeros(shape, dtype=torch.long, device=device)
    proposed.view(-1)[read] = proposals.tokens
    confidence = torch.full(shape, float("-inf"), device=device)
    confidence.view(-1)[read] = proposals.confidence
    entropy = None
    if proposals.entropy is not None:
        entropy = torch.full(shape, float("inf"), device=device)
        entropy.view(-1)[read] = proposals.entropy
    canvases = Canvases(proposed, confidence, entropy, num_read, requests if policy.edits else None)
    schedule = [policy.min_count(r.step_in_block, p, block_length) for r, p in zip(requests, params, strict=True)]
    write = BATCHED_RULES[type(policy)](policy, canvases, schedule, params)  # [R, B] bool
    table = torch.where(write, proposed, -1).tolist()  # one transfer
    accepted = [[(i, t) for i, t in enumerate(row) if t >= 0] for row in table]
    logprobs = written_logprobs(proposals, accepted, positions) if proposals.logprobs else {}
    # A block that writes nothing carries no logprobs list, as `Proposal.write` gives it.
    return [BlockWrite(pairs, logprobs.get(r) if pairs else None) for r, pairs in enumerate(accepted)]


@dataclass(frozen=True)
class _Thresholds:
    threshold: torch.Tensor
    """[R, 1]: each row's threshold, in the confidence's dtype."""


def top_k_rows(confidence: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """[R, B] bool with row r's ks[r] most confident positions set: `topk` of each row with its own k (rows that
    share a k in one call; a row's picks among ties depend on k, never on the other rows)."""
    accept = torch.zeros_like(confidence, dtype=torch.bool)
    for k in sorted(set(ks) - {0}):
        if all(each == k for each in ks):
            accept.scatter_(1, torch.topk(confidence, k, dim=1).indices, True)
            break
        chosen = torch.tensor([r for r, each in enumerate(ks) if each == k], device=confidence.device)
        picks = torch.topk(confidence[chosen], k, dim=1).indices  # [r_k, k]
        accept[chosen[:, None], picks] = True
    return accept


@dataclass(frozen=True)
class Canvases:
    """The blocks' proposals as canvases [R, B] (R blocks of B positions; positions not read: -inf confidence,
    +inf entropy), what each policy's batched rule reads."""

    proposed: torch.Tensor
    """[R, B] long: the proposed tokens (0 where not read)."""
    confidence: torch.Tensor
    """[R, B] fp32."""
    entropy: torch.Tensor | None
    """[R, B] fp32, for the entropy rule; else None."""
    num_read: list[int]
    """Positions read per block: its masked ones (the edit policy's rule, which also reads generated ones, counts
    the masked ones itself)."""
    requests: list[Request] | None = None
    """For the edit rule: the blocks' requests, whose canvases hold the tokens before the step."""


def _fixed(
    policy: MaskPolicy, canvases: Canvases, schedule: list[int], params: list[ResolvedSamplingParams]
) -> torch.Tensor:
    """FixedStepsPolicy: the schedule's count of most confident, clamped to the masked count (top_k_mask)."""
    counts = [min(c, m) for c, m in zip(schedule, canvases.num_read, strict=True)]
    return top_k_rows(canvases.confidence, counts)


def _threshold(
    policy: MaskPolicy, canvases: Canvases, schedule: list[int], params: list[ResolvedSamplingParams]
) -> torch.Tensor:
    """ThresholdPolicy: every proposal that `passes` (above the threshold, strictly, in the confidence's dtype),
    unless fewer than the schedule's count pass: then that count of most confident."""
    assert isinstance(policy, ThresholdPolicy)
    confidence = canvases.confidence
    threshold = torch.tensor([p.threshold for p in params], dtype=confidence.dtype, device=confidence.device)
    above = policy.passes(confidence, _Thresholds(threshold[:, None]))  # the rule's one statement
    enough = above.sum(dim=1) >= torch.tensor(schedule, device=confidence.device)
    return torch.where(enough[:, None], above, _fixed(policy, canvases, schedule, params))


def _entropy(
    policy: MaskPolicy, canvases: Canvases, schedule: list[int], params: list[ResolvedSamplingParams]
) -> torch.Tensor:
    """EntropyBoundPolicy: the longest prefix of the masked positions by ascending entropy (stable) whose sum
    less its largest member stays within the bound; at least one."""
    entropy = canvases.entropy
    assert entropy is not None, "the entropy rule needs the proposals' entropies"
    order = torch.sort(entropy, dim=1, stable=True).indices  # [R, B]: the masked first (the rest are +inf)
    ranked = entropy.gather(1, order)
    excess = torch.cumsum(ranked, dim=1) - ranked  # a row's masked prefix holds the per-request cumsum's values
    bound = torch.tensor([p.entropy_bound for p in params], dtype=entropy.dtype, device=entropy.device)
    rank = torch.arange(entropy.shape[1], device=entropy.device)[None, :]
    valid = rank < torch.tensor(canvases.num_read, device=entropy.device)[:, None]
    count = ((excess <= bound[:, None]) & valid).sum(dim=1).clamp_min(1)
    return torch.zeros_like(valid).scatter_(1, order, valid & (rank < count[:, None]))


def _edit(
    policy: MaskPolicy, canvases: Canvases, schedule: list[int], params: list[ResolvedSamplingParams]
) -> torch.Tensor:
    """EditPolicy: the threshold rule over the masked positions (mask-to-token), and every read generated
    position whose proposal differs from its token with confidence above `edit_threshold` (token-to-token)."""
    assert canvases.requests is not None, "the edit rule reads the canvases"
    confidence, device = canvases.confidence, canvases.confidence.device
    mask_token_id = canvases.requests[0].mask_token_id  # one mask token's blocks
    canvas = torch.tensor([r.canvas for r in canvases.requests], dtype=torch.long, device=device)  # [R, B]
    masked = canvas == mask_token_id
    only_masked = Canvases(
        canvases.proposed,
        confidence.masked_fill(~masked, float("-inf")),  # Proposal.only(masked)
        None,
        [r.canvas.count(mask_token_id) for r in canvases.requests],
    )
    fill = _threshold(policy, only_masked, schedule, params)
    edit_threshold = torch.tensor([p.edit_threshold for p in params], dtype=confidence.dtype, device=device)
    edit = ~masked & (canvases.proposed != canvas) & (confidence > edit_threshold[:, None])
    return fill | edit


BatchedRule = Callable[[MaskPolicy, Canvases, list[int], list[ResolvedSamplingParams]], torch.Tensor]
BATCHED_RULES: dict[type[MaskPolicy], BatchedRule] = {
    ThresholdPolicy: _threshold,
    FixedStepsPolicy: _fixed,
    EntropyBoundPolicy: _entropy,
    EditPolicy: _edit,
}
"""The policies decoded here, by exact type, with (the policy, the proposals as canvases, the schedule's count
per block, params) -> [R, B] bool written."""
