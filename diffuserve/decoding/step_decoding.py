"""A step's decoding, batch first, in two calls the model runner makes (`BlockDecoding.plan` before the forward,
`BlockDecoding.decode` after it):

    plan     per scheduled request: its block (the decoder, the canvas indices it reads, the tokens it feeds the
             forward) and the draft the step's commit verifies (decoder=verified: the checked positions and their
             drafted tokens)
    decode   the drafts checked first (decoding/verification.py); then the blocks' logits a chunk at a time (at
             most `max_rows` rows of fp32 logits alive at once), each chunk's blocks grouped by decoder, one
             `decode_blocks` call per decoder; verified heads checked against the rows they were read from; the
             self-conditioning input of canvases that go on handed to the caller's `keep`

Knows the plan and the rows, not the batch's layout: which row of the forward holds what is the runner's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.protocol import BlockDecode, Decoder


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class PlannedBlock:
    """One request's block at this step."""

    request: Request
    decoder: Decoder
    read: list[int]
    """Canvas indices whose logits the decoder reads (only the head when the block is not computed)."""
    tokens: list[int]
    """What the block feeds the forward (empty when it is not computed)."""


@dataclass(frozen=True)
class PlannedDraft:
    """The draft a request's commit verifies this step."""

    request: Request
    decoder: Decoder
    """The request's own decoder, which verifies (through its wrappers)."""
    positions: list[int]
    """The absolute positions checked (ascending, consecutive)."""
    drafts: list[int]
    """Their drafted tokens."""


@dataclass
class DecodingPlan:
    blocks: dict[str, PlannedBlock] = field(default_factory=dict)
    """By request id, in the step's order."""
    drafts: dict[str, PlannedDraft] = field(default_factory=dict)


@dataclass(frozen=True)
class StepLogits:
    """Where the forward's rows for the plan are, and how logits are made from them."""

    hidden: torch.Tensor
    """[N, H] the step's rows."""
    block_rows: torch.Tensor
    """[M] the row of each block's read positions, blocks in the plan's order."""
    draft_rows: torch.Tensor
    """[D] the causal row predicting each checked draft position, drafts in the plan's order."""
    compute_logits: Callable[[torch.Tensor], torch.Tensor]
    max_rows: int
    """The most logit rows computed at once."""


@dataclass(frozen=True)
class DecodedStep:
    writes: dict[str, BlockWrite]
    verdicts: dict[str, Verification]
    failures: dict[str, str]
    """Requests whose grammar failed during the step's decoding (request id -> message)."""


SelfConditioningSink = Callable[[list[tuple[Request, torch.Tensor]]], None]
"""Takes the [C, V] tempered logits of each canvas that goes on, one chunk at a time."""


def logit_chunks(blocks: list[PlannedBlock], max_rows: int) -> list[list[PlannedBlock]]:
    """The step's blocks in order, cut into runs of at most `max_rows` logit rows (a block larger than that is a
    run of its own)."""
    chunks: list[list[PlannedBlock]] = []
    rows = 0
    for block in blocks:
        if not chunks or rows + len(block.read) > max_rows:
            chunks.append([])
            rows = 0
        chunks[-1].append(block)
        rows += len(block.read)
    return chunks


def decode_chunk(
    blocks: list[PlannedBlock], logits: torch.Tensor, skip: set[str], generators: RequestGenerators
) -> list[tuple[PlannedBlock, BlockDecode, int]]:
    """logits [rows of the chunk's blocks, V] fp32 -> each decoded block with its first row in `logits`; the
    blocks of one decoder go to it in one `decode_blocks` call."""
    groups: dict[int, tuple[Decoder, list[PlannedBlock], list[int]]] = {}  # by decoder: its blocks and rows
    starts: dict[str, int] = {}
    start = 0
    for block in blocks:
        starts[block.request.request_id] = start
        if block.request.request_id not in skip:
            _, grouped, rows = groups.setdefault(id(block.decoder), (block.decoder, [], []))
            grouped.append(block)
            rows.extend(range(start, start + len(block.read)))
        start += len(block.read)
    decoded: list[tuple[PlannedBlock, BlockDecode, int]] = []
    for decoder, grouped, rows in groups.values():
        # All of the chunk's rows in order (the common case: one decoder for every block) need no copy.
        same = len(rows) == logits.shape[0]
        taken = logits if same else logits.index_select(0, torch.tensor(rows, device=logits.device))
        requests, reads = [b.request for b in grouped], [b.read for b in grouped]
        for block, decoding in zip(grouped, decoder.decode_blocks(requests, taken, reads, generators), strict=True):
            decoded.append((block, decoding, starts[block.request.request_id]))
    return decoded
