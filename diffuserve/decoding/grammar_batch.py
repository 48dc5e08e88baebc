"""The grammar walk (grammar_walk.py) of many blocks at once: their walks advance in lockstep, and position k of
every walk still going is masked by its matcher and proposed in one pass (`propose_rows`), with one host transfer
of the tokens and confidences, instead of a handful of tensor operations per position.

Exactly the one-by-one walk's numbers: each block's setup and end are `StructuredDecoding.begin` and `end`; its
rows are masked as `grammar_masked` masks them (elementwise, with the same fallback for a row the grammar and the
early stop ids leave empty); `propose_rows` gives each row what `propose` gives it alone (row-wise operations, a
sampled block drawing its one row per position from its own generator, in the same order); confidences go through
the host as the walk's `float()` takes them, and so do the logprob columns of blocks that ask for them. The
matchers are fed per block, as before: a matcher that fails fails its own block only. The entropy policy is
batched on the CPU only, as mask.py batches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.grammar_walk import StructuredDecoding, WalkStart
from diffuserve.decoding.logprobs import LogprobRows
from diffuserve.decoding.mask_policies import MaskPolicy, Proposal
from diffuserve.decoding.propose_batch import LogprobColumns, propose_rows
from diffuserve.sampling_params import ResolvedSamplingParams


@dataclass
class _Walk:
    """One block's walk in progress: its rows in the step's rows, and what it proposed so far."""

    block: int
    start: WalkStart
    first_row: int
    indices: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    logprobs: list[tuple[float, int, list[int], list[float]]] = field(default_factory=list)
    """With logprobs: per position walked, the proposed token's logprob and rank, the top ids and their logprobs."""
    going: bool = True
    failed: bool = False
    """Its matcher failed (reported by `take_failures`): nothing is written."""


def walk_blocks(
    structured: StructuredDecoding,
    requests: list[Request],
    rows: torch.Tensor,
    positions: list[list[int]],
    params: list[ResolvedSamplingParams],
    policy: MaskPolicy,
    generators: RequestGenerators,
    block_length: int,
) -> list[tuple[Proposal | None, list[int]]]:
    """rows [N, V]: each block's rows at its read `positions`, one block after another (the mask and early stop ids
    already forbidden) -> per block, as `StructuredDecoding.decode` gives it: the proposal and the canvas indices
    written (None and [] for a block whose matcher failed, reported by `take_failures`)."""
    walks: list[_Walk] = []
    first_row = 0
    for b, request in enumerate(requests):
        try:
            start = structured.begin(request, positions[b], block_length, params[b], policy)
            walks.append(_Walk(b, start, first_row, going=bool(start.positions)))
        except RuntimeError as e:
            structured.fail(request, e)
        first_row += len(positions[b])
    for k in range(max((len(w.start.positions) for w in walks), default=0)):
        going = [w for w in walks if w.going and k < len(w.start.positions)]
        if not going:
            break
        _walk_position(structured, going, k, requests, rows, params, generators, policy.needs_entropy)
    found: list[tuple[Proposal | None, list[int]]] = [(None, []) for _ in requests]
    for walk in walks:
        request = requests[walk.block]
        if walk.failed:
            continue
        block_params = params[walk.block]
        num_top = None if block_params.logprobs is None else min(block_params.logprobs, rows.shape[-1])
        proposal = _proposal(walk, block_length, policy.needs_entropy, num_top, rows.device)
        written = structured.end(
            walk.start, request, proposal, walk.confidences, params[walk.block], policy, block_length
        )
        found[walk.block] = (proposal, written)
    return found


def _walk_position(
    structured: StructuredDecoding,
    going: list[_Walk],
    k: int,
    requests: list[Request],
    rows: torch.Tensor,
    params: list[ResolvedSamplingParams],
    generators: RequestGenerators,
    need_entropy: bool,
) -> None:
    """Position k of every walk in `going`: masked, proposed in one pass, fed to each matcher; a walk stops where
    its early stop says so, or where its matcher fails."""
    ready, allowed = [], []
    for walk in going:
        try:
            allowed.append(walk.start.state.allowed())
            ready.append(walk)
        except RuntimeError as e:
            structured.fail(requests[walk.block], e)
            walk.going, walk.failed = False, True
    if not ready:
        return
    going = ready
    index = torch.tensor([w.first_row + k for w in going], dtype=torch.long, device=rows.device)
    masked = _grammar_masked(rows.index_select(0, index), allowed)
    chosen = [requests[w.block] for w in going]
    proposals = propose_rows(
        masked, chosen, [params[w.block] for w in going], [(i, i + 1) for i in range(len(going))], generators, None,
        need_entropy,
    )  # fmt: skip
    tokens, confidences = proposals.tokens.tolist(), proposals.confidence.tolist()
    entropies = proposals.entropy.tolist() if proposals.entropy is not None else None
    logprobs = _host_columns(proposals.logprobs)
    for i, walk in enumerate(going):
        walk.indices.append(walk.start.positions[k])
        walk.tokens.append(tokens[i])
        walk.confidences.append(confidences[i])
        if entropies is not None:
            walk.entropies.append(entropies[i])
        if i in logprobs:
            walk.logprobs.append(logprobs[i])
        try:
            walk.start.state.push(tokens[i])
        except RuntimeError as e:
            structured.fail(chosen[i], e)
            walk.going, walk.failed = False, True
            continue
        stop = walk.start.stop
        walk.going = not (stop is not None and stop(k, confidences[i]))


def _host_columns(groups: list[LogprobColumns]) -> dict[int, tuple[float, int, list[int], list[float]]]:
    """The logprob columns of a position's proposals on the host (one transfer per column of each group) -> per
    walk (its index among the position's) that asks for them: (logprob, rank, top ids, top logprobs)."""
    found = {}
    for group in groups:
        chosen, rank = group.chosen.tolist(), group.rank.tolist()
        top_ids, top_values = group.top_ids.tolist(), group.top_values.tolist()
        for walk, row in group.first_row.items():
            found[walk] = (chosen[row], rank[row], top_ids[row], top_values[row])
    return found


def _grammar_masked(rows: torch.Tensor, allowed: list[np.ndarray | None]) -> torch.Tensor:
    """rows [A, V], each with its grammar's allowed tokens (None: unconstrained) -> `grammar_masked` of every row:
    forbidden tokens at -inf, and a constrained row left with no finite logit replaced by zeros at its allowed
    tokens (those equally likely)."""
    constrained = [i for i, a in enumerate(allowed) if a is not None]
    if not constrained:
        return rows
    permitted = np.ones((len(allowed), rows.shape[-1]), dtype=bool)
    for i in constrained:
        permitted[i] = allowed[i]
    forbidden = ~torch.from_numpy(permitted).to(rows.device)
    masked = rows.masked_fill(forbidden, float("-inf"))
    empty = ~torch.isfinite(masked).any(-1)  # [A]
    empty[[i for i in range(len(allowed)) if allowed[i] is None]] = False  # an unconstrained row stays as it is
    if bool(empty.any()):
        masked[empty] = torch.zeros_like(masked[empty]).masked_fill(forbidden[empty], float("-inf"))
    return masked


def _proposal(
    walk: _Walk, block_length: int, need_entropy: bool, num_top: int | None, device: torch.device
) -> Proposal:
    """The canvas-shaped proposal of a walk's positions ([B]: the walked ones set, as the one-by-one walk sets them)."""
    index = torch.tensor(walk.indices, dtype=torch.long, device=device)
    tokens = torch.zeros(block_length, dtype=torch.long, device=device)
    confidence = torch.full((block_length,), float("-inf"), device=device)
    tokens[index] = torch.tensor(walk.tokens, dtype=torch.long, device=device)
    confidence[index] = torch.tensor(walk.confidences, device=device)
    entropy = None
    if need_entropy:
        entropy = torch.full((block_length,), float("inf"), device=device)
        entropy[index] = torch.tensor(walk.entropies, device=device)
    return Proposal(tokens, confidence, entropy, _logprob_rows(walk, index, block_length, num_top, device))


def _logprob_rows(
    walk: _Walk, index: torch.Tensor, block_length: int, num_top: int | None, device: torch.device
) -> LogprobRows | None:
    """The walk's logprobs as the one-by-one walk's canvas-shaped rows (None unless its block asks for them)."""
    if num_top is None:
        return None
    rows = LogprobRows.empty(block_length, num_top, device)
    if walk.logprobs:
        chosen, rank, top_ids, top_values = zip(*walk.logprobs, strict=True)
        rows.chosen[index] = torch.tensor(chosen, device=device)
        rows.rank[index] = torch.tensor(rank, dtype=torch.long, device=device)
        rows.top_ids[index] = torch.tensor(top_ids, dtype=torch.long, device=device)
        rows.top_values[index] = torch.tensor(top_values, device=device)
    return rows
