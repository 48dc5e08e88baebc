"""Prompt scoring (`prompt_logprobs`): the block chain rule's variants as extra queries of a step's forward, and
their logits turned into each prompt token's `Logprob` and top alternatives (docs/serving/logprobs.md).

A block-diffusion model has no left-to-right likelihood; the engine scores a prompt x with the chain rule inside
each block. Position p (p >= 1) of block b = p // B is scored by its *variant*: block b with the prompt tokens
before p revealed and the rest masked, at the block's positions, attending to the committed K/V of blocks < b
and to itself, exactly as a denoising step previews a block. The row at p (these families predict a position
from its own row) gives log p(x_p | x_<bB committed, x_bB..x_p-1 revealed):

    log p(x) = sum_{p >= 1} log_softmax(logits of the variant of p, at row p)[x_p]

Families that predict with the AR shift (clover_moe: position p from row p - 1) read the same variant at row
p - 1, a revealed prompt token's row; a block's first position (offset 0) has no revealed row in its block and is
read from the clean stream's row p - 1, the last committed position (the row a block's first generated position
is decoded from), so it needs no variant. There a variant is a block preview of the request's state slot: the
GDN layers read the state after the committed blocks (never writing it) and the attention layers read the
committed pages and the variant's own K/V, so the step must commit exactly the blocks before the scored block
(core/cache/recurrent.py). A checkpoint without the block-diffusion tensors is autoregressive and scores as a
plain causal LM: its variants are run causally (causal mask, GDN state advanced in a copy that is dropped), so
row p - 1 is the clean causal forward's, giving log p(x_p | x_<p).

Layout: the scheduler hands a step positions [score_start, score_end) of a request whose earlier blocks are
committed by that forward. Their variants follow the requests' own queries in the flattened batch, one sequence
per block: queries the block's variants one after another, keys the committed prefix then the variants'
own K/V, which go to scratch pages the scheduler lends for the step (`Request.score_page_ids`) and never join
the prefix cache. The mask lets each variant see the prefix and itself only. The variants read the prefix in the
same forward that commits it (the K/V are written before any query attends), as a fused commit's block does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from diffuserve.core.outputs import TokenLogprobs
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.model.layers.attention import SequenceSlice

KeySlots = Callable[[list[int], int], torch.Tensor]
"""(page ids, length) -> [length] long: the cache slots of positions 0 .. length-1 of those pages."""


def variant(prompt: list[int], position: int, block_length: int, mask_token_id: int) -> list[int]:
    """The block of `position` as its score reads it: the prompt tokens before `position` revealed, the rest
    masked (B tokens)."""
    tail = prompt[position // block_length * block_length : position]
    return tail + [mask_token_id] * (block_length - len(tail))


@dataclass(frozen=True)
class ScoredPositions:
    """One request's positions scored this step, and their rows among the step's scoring logits."""

    request_id: str
    positions: list[int]
    token_ids: list[int]
    """The prompt tokens at `positions`."""
    num_top: int
    """Top alternatives wanted per position (the request's prompt_logprobs)."""


@dataclass
class ScoringRows:
    """The scoring queries of a step, appended after the requests' own queries."""

    shift: bool = False
    """Position p is read from row p - 1 (clover_moe): a block's first position from its request's last
    committed row, filled in by the runner (`previous_rows`)."""
    causal: bool = False
    """Variants attend to themselves causally (an autoregressive checkpoint) rather than whole."""
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[torch.Tensor] = field(default_factory=list)
    sequences: list[SequenceSlice] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    """Batch row of each scored position (in `requests` order)."""
    requests: list[ScoredPositions] = field(default_factory=list)
    variants: list[tuple[int, Request]] = field(default_factory=list)
    """First batch row of each variant and its request (the hybrid runner previews its state slot there)."""
    previous_rows: list[tuple[int, Request]] = field(default_factory=list)
    """With `shift`: (index into `logit_rows`, request) of each block's first position, whose row is the
    request's last committed one; -1 in `logit_rows` until the runner sets it."""

    def add(self, work: ScheduledRequest, first_row: int, key_slots: KeySlots) -> None:
        """Appends `work`'s variants; `first_row`: the batch row the scoring queries start at."""
        request, block = work.request, work.request.block_length
        positions = list(range(work.score_start, work.score_end))
        scratch = key_slots(request.score_page_ids, len(positions) * block)
        start = 0
        for b in sorted({p // block for p in positions}):
            group = [p for p in positions if p // block == b]
            if self.shift and group[0] % block == 0:
                self.previous_rows.append((len(self.logit_rows), request))
                self.logit_rows.append(-1)
                group = group[1:]
            if not group:
                continue
            rows = first_row + len(self.input_ids)
            for i, p in enumerate(group):
                self.input_ids += variant(request.prompt_token_ids, p, block, request.mask_token_id)
                self.positions += range(b * block, (b + 1) * block)
                self.variants.append((rows + i * block, request))
                self.logit_rows.append(rows + i * block + p % block - self.shift)
            slots = scratch[start : start + len(group) * block]
            start += len(group) * block
            self.slot_mapping.append(slots)
            keys = torch.cat([key_slots(request.page_ids, b * block), slots])
            mask = variant_mask(len(group), block, b, keys.device, self.causal)
            self.sequences.append(SequenceSlice.of(rows, len(group) * block, keys, mask))
        tokens = [request.prompt_token_ids[p] for p in positions]
        num_top = request.params.prompt_logprobs or 0  # set: the scheduler scores only requests that ask
        self.requests.append(ScoredPositions(request.request_id, positions, tokens, num_top))


def variant_mask(
    num_variants: int, block_length: int, block_index: int, device: torch.device, causal: bool = False
) -> torch.Tensor | None:
    """[V * B, b * B + V * B] bool for V variants of block b: every variant sees the committed prefix and itself
    (causally with `causal`), never another variant. None when one variant sees every key."""
    if num_variants == 1 and not causal:
        return None
    variant_of = torch.arange(num_variants * block_length, device=device) // block_length
    own = variant_of[:, None] == variant_of[None, :]
    if causal:
        own = own.tril()
    prefix = torch.ones(num_variants * block_length, block_index * block_length, dtype=torch.bool, device=device)
    return torch.cat([prefix, own], dim=1)


def prompt_logprobs(logits: torch.Tensor, scored: list[ScoredPositions]) -> dict[str, list[tuple[int, TokenLogprobs]]]:
    """logits [M, V] fp32 at the scored rows (in `scored` order) -> per request id, (position, TokenLogprobs):
    the prompt token first, then its top alternatives by rank, as for generated tokens (decoding/logprobs.py)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    out: dict[str, list[tuple[int, TokenLogprobs]]] = {}
    row = 0
    for s in scored:
        rows = torch.arange(len(s.positions), device=logits.device)
        tokens = torch.tensor(s.token_ids, dtype=torch.long, device=logits.device)
        values = logprob_rows(log_probs[row : row + len(rows)], tokens, rows, len(rows), s.num_top)
        out[s.request_id] = list(zip(s.positions, token_logprobs(values, tokens, rows)))
        row += len(rows)
    return out
