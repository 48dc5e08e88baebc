"""From logits at a block's positions (those the decoder asked for) to a Proposal: temperature, top-k, top-p, a
per-request seeded generator. Pure functions over tensors; knows nothing of decoders' policies."""

from __future__ import annotations

import torch

from diffuserve.engine.decoders import Proposal
from diffuserve.sampling_params import ResolvedSamplingParams


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
) -> Proposal:
    """logits [M, V] fp32 at canvas indices `positions` [M] -> canvas-shaped Proposal [B].

    temperature 0: the argmax and its softmax probability; otherwise a multinomial draw from the tempered,
    filtered distribution and that distribution's probability of the drawn token.
    """
    if params.is_greedy:
        probs = torch.softmax(logits, dim=-1)
        confidence, tokens = probs.max(dim=-1)
    else:
        probs = torch.softmax(filter_logits(logits / params.temperature, params.top_k, params.top_p), dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        confidence = probs.gather(-1, tokens[:, None]).squeeze(-1)
    canvas_tokens = torch.zeros(block_length, dtype=torch.long, device=logits.device)
    canvas_conf = torch.full((block_length,), float("-inf"), device=logits.device)
    canvas_tokens[positions], canvas_conf[positions] = tokens, confidence
    entropy = None
    if need_entropy:
        entropy = torch.full((block_length,), float("inf"), device=logits.device)
        entropy[positions] = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    return Proposal(canvas_tokens, canvas_conf, entropy)
