"""`propose`'s tokens and confidences for many blocks' rows at once (mask_batch.py's batched pass): the greedy
blocks in one pass, the sampled ones in one pass per distinct (temperature, top_k, top_p), each sampled block
drawing its tokens with one `multinomial` call on its own rows from its own generator, as `propose` does.

Exactly `propose`'s numbers, not close to them: every operation here is `propose`'s own (mask_policies.py), run on
more rows, and each is row-wise (an elementwise op, a softmax, a `topk` or `sort` or `cumsum` along a row, a
draw from a block's own rows and generator), so a row's result does not depend on the rows beside it. The
entropy's row sum is the one reduction whose order a GPU may change with the row count; mask.py batches the
entropy policy on the CPU only. Knows nothing of policies or requests' canvases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask_policies import best_token, filter_logits
from diffuserve.sampling_params import ResolvedSamplingParams

SamplingKey = tuple[float, int, float] | None
"""What a block's distribution is made with: (temperature, top_k, top_p), None when greedy."""


@dataclass(frozen=True)
class RowProposals:
    """Per row of the rows proposed over, [N] each."""

    tokens: torch.Tensor
    """long: the proposed token (never the mask token)."""
    confidence: torch.Tensor
    """fp32: its probability under the proposing distribution."""
    entropy: torch.Tensor | None
    """fp32: that distribution's entropy (nats); None unless asked for."""


def propose_rows(
    rows: torch.Tensor,
    requests: list[Request],
    params: list[ResolvedSamplingParams],
    spans: list[tuple[int, int]],
    generators: RequestGenerators,
    never: int | None,
    need_entropy: bool,
) -> RowProposals:
    """rows [N, V] fp32 (the mask token's logit kept), block b's rows at spans[b] = (first, end) -> what
    `propose` gives every row. `never`: the mask token, when it is a vocabulary id."""
    device = rows.device
    tokens = torch.empty(rows.shape[0], dtype=torch.long, device=device)
    confidence = torch.empty(rows.shape[0], device=device)
    entropy = torch.empty(rows.shape[0], device=device) if need_entropy else None
    for key, members in _by_sampling(params).items():
        index = [row for b in members for row in range(*spans[b])]
        whole = len(index) == rows.shape[0]
        where = None if whole else torch.tensor(index, dtype=torch.long, device=device)
        taken = rows if where is None else rows.index_select(0, where)
        if key is None:
            probs = torch.softmax(taken, dim=-1)  # [n, V], the mask token included (as `propose` at temperature 0)
            chosen = best_token(taken, never)
        else:
            probs = _sampling_distribution(taken, key, never)
            chosen = _draws(probs, [requests[b] for b in members], [spans[b] for b in members], generators)
        picked = probs.gather(-1, chosen[:, None]).squeeze(-1)
        spread = None if entropy is None else -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        if where is None:
            tokens, confidence, entropy = chosen, picked, spread
            break
        tokens[where], confidence[where] = chosen, picked
        if entropy is not None and spread is not None:
            entropy[where] = spread
    return RowProposals(tokens, confidence, entropy)


def _by_sampling(params: list[ResolvedSamplingParams]) -> dict[SamplingKey, list[int]]:
    """The blocks (indices into `params`) of each distinct sampling setting, in order."""
    groups: dict[SamplingKey, list[int]] = {}
    for b, p in enumerate(params):
        key = None if p.is_greedy else (p.temperature, p.top_k, p.top_p)
        groups.setdefault(key, []).append(b)
    return groups


def _sampling_distribution(logits: torch.Tensor, key: tuple[float, int, float], never: int | None) -> torch.Tensor:
    """logits [n, V] -> the tempered, filtered distribution [n, V] `propose` draws from (the mask token at 0)."""
    temperature, top_k, top_p = key
    tempered = logits / temperature  # a new tensor: the caller's rows are not touched
    if never is not None:
        tempered[:, never] = float("-inf")
    return torch.softmax(filter_logits(tempered, top_k, top_p), dim=-1)


def _draws(
    probs: torch.Tensor, requests: list[Request], spans: list[tuple[int, int]], generators: RequestGenerators
) -> torch.Tensor:
    """probs [n, V], the blocks' rows one after another -> [n] tokens, each block's drawn from its own generator
    over its own rows (one call per block, as `propose` draws them: a block's draws never depend on the others)."""
    draws, start = [], 0
    for request, (first, end) in zip(requests, spans, strict=True):
        count = end - first
        if count:  # a block with no rows to read draws nothing (multinomial refuses zero rows)
            block = probs[start : start + count]
            draws.append(torch.multinomial(block, 1, generator=generators.of(request)).squeeze(-1))
        start += count
    return torch.cat(draws) if draws else probs.new_empty(0, dtype=torch.long)
