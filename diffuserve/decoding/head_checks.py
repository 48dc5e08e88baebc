"""The step's plain block heads checked all at once: the verified requests' heads (each the first position of a
block, checked against the causal row it was read from) with no logprobs, penalties or grammar.

Greedy heads: the row's argmax, one pass over all their rows. Sampled heads: the speculative-sampling check of
decoding/verified.py's `_check` (the draft kept with probability p(draft), else a draw from p without it), with p
made for all heads of one (temperature, top_k, top_p) in one pass and each head's draws (one uniform, and one
`multinomial` where it is rejected) taken from its own generator in the order `_check` takes them, so every
verdict is the one-by-one check's. The mask token and, below min_tokens, the stop ids are forbidden first, as for
any causal check. Knows nothing of the requests' blocks beyond their heads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_in_canvases
from diffuserve.decoding.propose_batch import SamplingKey, sampling_key, sampling_scores

KEPT_HEAD = Verification(1, 1, None)
"""A head the check keeps, with no logprobs asked for."""


@dataclass(frozen=True)
class PlainHead:
    request: Request
    write: BlockWrite
    """The block's write, the head at canvas index 0."""
    row: int
    """The row of the step's logits the head was read from."""
    token: int
    """The head's drafted token."""


def check_plain_heads(
    heads: list[PlainHead], logits: torch.Tensor, generators: RequestGenerators
) -> dict[str, BlockWrite]:
    """logits [R, V] fp32 -> each head's write carrying its check (the token the check drew, where another,
    written in its place)."""
    index = torch.tensor([head.row for head in heads], dtype=torch.long, device=logits.device)
    rows = forbid_in_canvases([h.request for h in heads], logits.index_select(0, index)[:, None, :])[:, 0]  # [H, V]
    groups: dict[SamplingKey, list[int]] = {}
    for i, head in enumerate(heads):
        groups.setdefault(sampling_key(head.request.params), []).append(i)
    verdicts: list[Verification | None] = [None] * len(heads)
    for key, members in groups.items():
        taken = rows[torch.tensor(members, dtype=torch.long, device=rows.device)]
        drafts = [heads[i].token for i in members]
        if key is None:
            found = _greedy(taken, drafts)
        else:
            found = _sampled(taken, key, drafts, [heads[i].request for i in members], generators)
        for i, verdict in zip(members, found, strict=True):
            verdicts[i] = verdict
    return {h.request.request_id: with_head(h.write, v) for h, v in zip(heads, verdicts, strict=True) if v is not None}


def _greedy(rows: torch.Tensor, drafts: list[int]) -> list[Verification]:
    """Each head kept where it is its row's argmax, else replaced by it (one transfer)."""
    best = rows.argmax(dim=-1).tolist()
    return [KEPT_HEAD if b == d else Verification(1, 0, b) for b, d in zip(best, drafts, strict=True)]


def _sampled(
    rows: torch.Tensor,
    key: tuple[float, int, float],
    drafts: list[int],
    requests: list[Request],
    generators: RequestGenerators,
) -> list[Verification]:
    """rows [n, V] of heads sampled alike -> each kept with probability p(draft), else a draw from p without it;
    p the tempered, filtered distribution `_check` makes for one row."""
    probs = torch.softmax(sampling_scores(rows, key, None), dim=-1)  # [n, V]; the mask token is already forbidden
    draft = torch.tensor(drafts, dtype=torch.long, device=rows.device)
    uniforms = torch.stack([torch.rand((), generator=generators.of(r), device=rows.device) for r in requests])
    kept = (uniforms < probs.gather(-1, draft[:, None]).squeeze(-1)).tolist()  # one transfer
    found = []
    for i, (request, keep) in enumerate(zip(requests, kept, strict=True)):
        if keep:
            found.append(KEPT_HEAD)
            continue
        residual = probs[i].clone()
        residual[drafts[i]] = 0.0
        token = int(torch.multinomial(residual, 1, generator=generators.of(request)).item())
        found.append(Verification(1, 0, token))
    return found


def with_head(write: BlockWrite, verdict: Verification) -> BlockWrite:
    """`write` carrying its head's check, the token the check wrote (if another) in place of the draft's."""
    if verdict.token is None:
        return replace(write, head=verdict)
    accepted = [(index, verdict.token if index == 0 else token) for index, token in write.accepted]
    return replace(write, accepted=accepted, head=verdict)
