"""The naive reference's own sampler and decoders, written from their documentation (docs/models/, the SDAR
and LLaDA2 reference `generate` loops in the project notes), never imported from the engine.

Everything is per block of B positions. A proposal holds, at each position whose logits were read, the token the
model proposes, its probability under the sampling distribution (the confidence, fp32 as the references keep
it) and the entropy of that distribution, and when asked the log of that distribution (for logprobs); positions
not read have confidence -inf. Top-k choices use
`torch.topk` over the whole block with -inf elsewhere, literally as the references do, so ties break alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.reference.reference_model import is_greedy
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class BlockProposal:
    tokens: dict[int, int]
    """block index -> proposed token, at every position read."""
    confidence: torch.Tensor
    """[B] fp32: probability of the proposed token; -inf where not read."""
    entropy: dict[int, float]
    """block index -> entropy (nats) of the position's distribution."""
    log_probs: torch.Tensor | None = None
    """[M, V] fp32: log of each read row's sampling distribution (-inf outside its support); None unless asked."""


def _resolved(knob: float | None) -> float:
    """A knob that ReferenceModel.resolve filled from the defaults (temperature and the decoders' thresholds and
    bounds always have one)."""
    assert knob is not None, "reference decode: resolve the params first (ReferenceModel.resolve)"
    return knob


def propose(
    logits: torch.Tensor,
    read: list[int],
    block: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    keep_log_probs: bool = False,
    mask_token: int | None = None,
) -> BlockProposal:
    """logits [M, V] fp32 at block indices `read` [M]. Greedy, as the LLaDA2 release's temperature-0 branch:
    the argmax of the logits and its probability under the softmax of the whole vocabulary, `mask_token`
    included; but a position is never given `mask_token`: where it is the argmax, the best other token (its
    probability taken from that same softmax). Sampled: `mask_token` removed, then logits / temperature, top-k,
    top-p, one draw per row from the renormalised distribution. The log-distribution kept for logprobs never
    holds `mask_token` (renormalised without it)."""
    without_mask = logits.clone()
    if mask_token is not None:
        without_mask[:, mask_token] = float("-inf")
    if is_greedy(params):
        scores = without_mask
        probs = torch.softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        if mask_token is not None:
            tokens = torch.where(tokens == mask_token, without_mask.argmax(dim=-1), tokens)
    else:
        scores = _top_p(_top_k(without_mask / _resolved(params.temperature), params.top_k), params.top_p)
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    confidence = torch.full((block,), float("-inf"))
    proposed, entropy = {}, {}
    for row, i in enumerate(read):
        token = int(tokens[row])
        proposed[i] = token
        confidence[i] = probs[row, token]
        p = probs[row][probs[row] > 0]
        entropy[i] = float(-(p * p.log()).sum())
    log_probs = torch.log_softmax(scores, dim=-1) if keep_log_probs else None
    return BlockProposal(proposed, confidence, entropy, log_probs)


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Each row keeps its k largest logits (ties at the k-th kept); 0 or -1 keep all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
    return torch.where(logits >= kth, logits, float("-inf"))


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Each row keeps its most probable tokens, in order, while the mass of those before stays <= top_p: the
    token that crosses top_p is kept (as transformers and the LLaDA2 reference do)."""
    if top_p >= 1.0:
        return logits
    out = torch.full_like(logits, float("-inf"))
    for row in range(logits.shape[0]):
        probs = torch.softmax(logits[row], dim=-1)
        order = torch.argsort(logits[row], descending=True, stable=True)
        mass_before = torch.cumsum(probs[order], dim=0) - probs[order]
        keep = order[mass_before <= top_p]
        out[row, keep] = logits[row, keep]
    return out


def schedule_count(block: int, steps: int, step: int) -> int:
    """Tokens the fallback / fixed schedule accepts at `step`: B // steps, one more for the first B % steps."""
    return block // steps + (1 if step < block % steps else 0)


def top_k_positions(confidence: torch.Tensor, k: int) -> list[int]:
    """The k most confident positions (k at most the number with a finite confidence)."""
    k = min(k, sum(1 for c in confidence.tolist() if c != float("-inf")))
    return sorted(torch.topk(confidence, k).indices.tolist())


def threshold_positions(confidence: torch.Tensor, count: int, threshold: float) -> list[int]:
    """Every position with confidence strictly above the threshold, or, if fewer than `count` are, the `count`
    most confident (SDAR `low_confidence_dynamic`, LLaDA2 `generate`). Compared in fp32, as the references do."""
    above = [i for i in range(len(confidence)) if bool(confidence[i] > threshold)]
    return above if len(above) >= count else top_k_positions(confidence, count)


def entropy_positions(proposal: BlockProposal, masked: list[int], bound: float) -> list[int]:
    """EB-sampler: masked positions by ascending entropy (ties: lower index first); accept each while the
    entropy of those accepted before it is <= bound, so always at least one."""
    accepted, before = [], 0.0
    for i in sorted(masked, key=lambda i: (proposal.entropy[i], i)):
        if before > bound:
            break
        accepted.append(i)
        before += proposal.entropy[i]
    return accepted


def positions_to_write(
    proposal: BlockProposal,
    canvas: list[int],
    masked: list[int],
    first_generated: int,
    step: int,
    params: SamplingParams,
) -> list[int]:
    """Block indices whose proposed token is written at this step, by params.decoder (already resolved)."""
    block = len(canvas)
    count = schedule_count(block, params.steps or block, step)
    only_masked = torch.full((block,), float("-inf"))
    for i in masked:
        only_masked[i] = proposal.confidence[i]
    if params.decoder == "fixed":
        return top_k_positions(only_masked, count)
    if params.decoder == "entropy":
        return entropy_positions(proposal, masked, _resolved(params.entropy_bound))
    fill = threshold_positions(only_masked, count, _resolved(params.threshold)) if masked else []
    if params.decoder == "threshold":
        return fill
    # edit: also rewrite accepted generated tokens whose new proposal differs and is confident enough.
    edits = [
        i
        for i in range(first_generated, block)
        if i not in masked
        and proposal.tokens[i] != canvas[i]
        and bool(proposal.confidence[i] > _resolved(params.edit_threshold))
    ]
    return sorted(set(fill) | set(edits))
