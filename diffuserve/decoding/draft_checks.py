"""The step's plain drafts checked all at once: the drafts of verified requests decoded greedily with no logprobs,
penalties or grammar (the common case), whose check is each causal row's argmax. Every such draft's rows go
through one argmax and one host transfer, where checking them one by one costs a forbid, an argmax and a transfer
per request. The mask token and, below min_tokens, the stop ids are forbidden first, as `VerifiedDecoder.verify`
forbids them, so every verdict is the one-by-one check's. Knows nothing of blocks beyond the drafts' positions.
"""

from __future__ import annotations

import torch

from diffuserve.core.writes import Verification
from diffuserve.decoding import verified
from diffuserve.decoding.generators import forbid_tokens
from diffuserve.decoding.step_decoding import PlannedDraft


def is_plain_greedy(draft: PlannedDraft) -> bool:
    """Whether the draft's check is its rows' argmax alone: the request's own decoder is the verified one
    (unwrapped: no penalties, no grammar), greedy, with no logprobs asked for."""
    params = draft.request.params
    return type(draft.decoder) is verified.VerifiedDecoder and params.is_greedy and params.logprobs is None


def check_greedy_drafts(drafts: list[tuple[PlannedDraft, int]], logits: torch.Tensor) -> dict[str, Verification]:
    """`drafts`: each plain greedy draft with the row of `logits` [D, V] fp32 where its checked positions' causal
    rows start (read, not edited) -> each request's verdict: its drafts kept up to the first that is not its row's
    argmax, which is written instead (`verified.greedy_verdict`, the one-by-one check's rule)."""
    device, vocab = logits.device, logits.shape[-1]
    rows = [start + i for draft, start in drafts for i in range(len(draft.positions))]
    taken = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=device))  # [n, V], a copy
    owners = [draft.request for draft, _ in drafts for _ in draft.positions]  # the request of each taken row
    masked = [(row, r.mask_token_id) for row, r in enumerate(owners) if 0 <= r.mask_token_id < vocab]
    if masked:
        index = torch.tensor(masked, dtype=torch.long, device=device).T  # [2, k]
        taken[index[0], index[1]] = float("-inf")
    first = 0
    for draft, _ in drafts:  # the stop ids below min_tokens: the few drafts that have any
        request, count = draft.request, len(draft.positions)
        if request.params.stop_ids and draft.positions[0] - request.num_prompt_tokens < request.params.min_tokens:
            offsets = [p - request.block_start for p in draft.positions]
            forbid_tokens(request, offsets, taken[first : first + count], forbid_mask=False)
        first += count
    best = taken.argmax(dim=-1).tolist()  # one transfer
    verdicts, first = {}, 0
    for draft, _ in drafts:
        kept, token = verified.greedy_verdict(draft.drafts, best[first : first + len(draft.positions)])
        first += len(draft.positions)
        verdicts[draft.request.request_id] = Verification(len(draft.positions), kept, token, None)
    return verdicts
