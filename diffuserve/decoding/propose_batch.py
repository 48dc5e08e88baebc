"""`propose` for many blocks' rows at once (mask_batch.py's batched pass): tokens, confidences, entropies and, for
blocks that ask, logprobs. Blocks are grouped by how their distribution is made, (temperature, top_k, top_p) or
greedy, and by their number of logprobs; each group is one pass, and each sampled block draws its tokens with one
`multinomial` call on its own rows from its own generator, as `propose` does.

Exactly `propose`'s numbers, not close to them: every operation here is `propose`'s own (mask_policies.py,
logprobs.py), run on more rows, and each is row-wise (an elementwise op, a softmax, a `topk` or `sort` or `cumsum`
along a row, a count of a row's larger values, a draw from a block's own rows and generator), so a row's result does
not depend on the rows beside it. The entropy's row sum is the one reduction whose order a GPU may change with the
row count; mask.py batches the entropy policy on the CPU only. Knows nothing of policies or requests' canvases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from diffuserve.core.outputs import TokenLogprobs
from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.logprobs import host_logprobs
from diffuserve.decoding.mask_policies import best_token, filter_logits
from diffuserve.sampling_params import ResolvedSamplingParams

SamplingKey = tuple[float, int, float] | None
"""How a row's distribution is made: (temperature, top_k, top_p), None when greedy."""
GroupKey = tuple[SamplingKey, int | None]
"""How a block's rows are proposed: its sampling key, and the logprobs it asks for (None: none)."""


@dataclass(frozen=True)
class LogprobColumns:
    """One group's logprobs, per row of its blocks (in block order): the proposed token's and the top k."""

    tokens: torch.Tensor
    """[n] long: the proposed token."""
    chosen: torch.Tensor
    """[n] fp32: the proposed token's logprob."""
    rank: torch.Tensor
    """[n] long: its 1-based rank (1 + the tokens strictly more probable)."""
    top_ids: torch.Tensor
    """[n, k] long: the k most probable tokens."""
    top_values: torch.Tensor
    """[n, k] fp32: their logprobs."""
    first_row: dict[int, int]
    """Block -> the group row of its first row."""


@dataclass(frozen=True)
class RowProposals:
    """Per row of the rows proposed over, [N] each, and the logprobs of the blocks that ask for them."""

    tokens: torch.Tensor
    """long: the proposed token (never the mask token)."""
    confidence: torch.Tensor
    """fp32: its probability under the proposing distribution."""
    entropy: torch.Tensor | None
    """fp32: that distribution's entropy (nats); None unless asked for."""
    logprobs: list[LogprobColumns] = field(default_factory=list)


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
    groups = _groups(params)
    if len(groups) == 1:  # one setting for every block (the common case): the group's rows are all, in order
        ((key, members),) = groups.items()
        return _propose_group(rows, key, members, requests, spans, generators, never, need_entropy)
    device = rows.device
    tokens = torch.empty(rows.shape[0], dtype=torch.long, device=device)
    confidence = torch.empty(rows.shape[0], device=device)
    entropy = torch.empty(rows.shape[0], device=device) if need_entropy else None
    logprobs: list[LogprobColumns] = []
    for key, members in groups.items():
        where = torch.tensor([row for b in members for row in range(*spans[b])], dtype=torch.long, device=device)
        taken = rows.index_select(0, where)
        group = _propose_group(taken, key, members, requests, spans, generators, never, need_entropy)
        tokens[where], confidence[where] = group.tokens, group.confidence
        if entropy is not None and group.entropy is not None:
            entropy[where] = group.entropy
        logprobs += group.logprobs
    return RowProposals(tokens, confidence, entropy, logprobs)


def _propose_group(
    rows: torch.Tensor,
    key: GroupKey,
    members: list[int],
    requests: list[Request],
    spans: list[tuple[int, int]],
    generators: RequestGenerators,
    never: int | None,
    need_entropy: bool,
) -> RowProposals:
    """rows [n, V]: the rows of the blocks `members` (one group), one block after another -> their proposals."""
    sampling, num_logprobs = key
    if sampling is None:
        scores = rows
        probs = torch.softmax(rows, dim=-1)  # [n, V], the mask token included (as `propose` at temperature 0)
        chosen = best_token(rows, never)
    else:
        scores = sampling_scores(rows, sampling, never)
        probs = torch.softmax(scores, dim=-1)
        chosen = _draws(probs, [requests[b] for b in members], [spans[b] for b in members], generators)
    confidence = probs.gather(-1, chosen[:, None]).squeeze(-1)
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1) if need_entropy else None
    if num_logprobs is None:
        return RowProposals(chosen, confidence, entropy)
    if sampling is None and never is not None:  # logprobs: the mask token at probability 0
        scores = scores.index_fill(-1, torch.tensor([never], device=rows.device), float("-inf"))
    columns = _columns(torch.log_softmax(scores, dim=-1), chosen, num_logprobs, members, spans)
    return RowProposals(chosen, confidence, entropy, [columns])


def written_logprobs(
    proposals: RowProposals, accepted: list[list[tuple[int, int]]], positions: list[list[int]]
) -> dict[int, list[TokenLogprobs]]:
    """Block -> the TokenLogprobs of its `accepted` (canvas index, token) pairs, in order, for every block that
    asks for logprobs; block b's rows read canvas `positions[b]`. One host transfer per group."""
    found: dict[int, list[TokenLogprobs]] = {}
    for group in proposals.logprobs:
        local: list[int] = []
        blocks = list(group.first_row)
        for b in blocks:
            row_of = {canvas: i for i, canvas in enumerate(positions[b])}
            local += [group.first_row[b] + row_of[i] for i, _ in accepted[b]]
        pick = torch.tensor(local, dtype=torch.long, device=group.tokens.device)
        entries = host_logprobs(
            group.tokens[pick],
            group.chosen[pick],
            group.rank[pick],
            group.top_ids[pick],
            group.top_values[pick],
        )
        for b in blocks:
            found[b], entries = entries[: len(accepted[b])], entries[len(accepted[b]) :]
    return found


def sampling_key(params: ResolvedSamplingParams) -> SamplingKey:
    """How a row's distribution is made: (temperature, top_k, top_p), or None when greedy."""
    return None if params.is_greedy else (params.temperature, params.top_k, params.top_p)


def _groups(params: list[ResolvedSamplingParams]) -> dict[GroupKey, list[int]]:
    """The blocks (indices into `params`) of each distinct (sampling setting, logprobs), in order."""
    groups: dict[GroupKey, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault((sampling_key(p), p.logprobs), []).append(b)
    return groups


def sampling_scores(logits: torch.Tensor, key: tuple[float, int, float], never: int | None) -> torch.Tensor:
    """logits [n, V] -> the tempered, filtered logits [n, V] sampled rows are drawn from (the mask token `never`,
    if any, at -inf)."""
    temperature, top_k, top_p = key
    tempered = logits / temperature  # a new tensor: the caller's rows are not touched
    if never is not None:
        tempered[:, never] = float("-inf")
    return filter_logits(tempered, top_k, top_p)


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


def _columns(
    log_probs: torch.Tensor, tokens: torch.Tensor, k: int, members: list[int], spans: list[tuple[int, int]]
) -> LogprobColumns:
    """log_probs [n, V] of a group's rows, their proposed tokens [n] -> the group's LogprobColumns (logprob_rows'
    operations, without the canvas)."""
    chosen = log_probs.gather(-1, tokens[:, None])  # [n, 1]
    rank = (log_probs > chosen).sum(-1) + 1
    top_values, top_ids = torch.topk(log_probs, min(k, log_probs.shape[-1]), dim=-1)
    first_row, start = {}, 0
    for b in members:
        first_row[b] = start
        start += spans[b][1] - spans[b][0]
    return LogprobColumns(tokens, chosen.squeeze(-1), rank, top_ids, top_values, first_row)
