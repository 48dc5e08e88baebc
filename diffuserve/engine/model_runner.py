"""Runs one engine step on the model (rank 0): builds the flattened batch, has the executor run the forward,
applies the decoders.

Input: the scheduler's work list. Output: per request, the canvas positions accepted this step and their tokens
(`BlockWrite`; with their logprobs for requests that ask, moved to the host only for the written positions).
It reads requests but never changes them (the engine applies results), and it owns the per-request sampling
generators and the expert statistics. The forward itself, and under tensor / expert parallelism sending it to the
worker ranks, is the executor's (see executor); only rank 0 builds batches and reads logits.

Batch layout for a step (N query tokens, requests one after another):

    input_ids  [ r0 commit tokens | r0 block | r1 block | r2 prefill chunk | ... ]   [N]
    positions  absolute positions of those tokens                                    [N]
    logit rows the positions each block's decoder reads (its masked ones; the edit   [M]
               decoder also its accepted generated ones)

Requests scoring their prompt (prompt_logprobs) add their variants after every request's own queries
(engine/prompt_scoring.py); the step's prompt scores are left in `prompt_scores` for the engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from diffuserve.engine.decoders import DECODERS, Proposal, propose
from diffuserve.engine.executor import ForwardInputs, ModelExecutor
from diffuserve.engine.experts import ExpertOffload, ExpertTracker
from diffuserve.engine.grammar_decoding import StructuredDecoding
from diffuserve.engine.logprobs import token_logprobs
from diffuserve.engine.output_processor import TokenLogprobs
from diffuserve.engine.prompt_scoring import ScoringRows, prompt_logprobs
from diffuserve.engine.request import BlockWrite, Request
from diffuserve.engine.scheduler import ScheduledRequest
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention import SequenceSlice, block_causal_mask
from diffuserve.model.layers.moe.offload_context import BlockRef, OffloadContext


@dataclass(frozen=True)
class BlockRows:
    """Where one request's block sits in the step batch."""

    work: ScheduledRequest
    token_start: int
    """Row of the block's first position in the step batch."""
    logit_start: int
    positions: list[int]
    """Canvas indices the decoder reads (their logits are rows logit_start .. logit_start + len(positions))."""


@dataclass(frozen=True)
class StepBatch:
    forward: ForwardInputs
    logit_rows: torch.Tensor
    blocks: list[BlockRows]
    scoring: ScoringRows | None = None


class ModelRunner:
    supports_prompt_scoring = True
    """Whether prompt_logprobs can be computed (not by the hybrid runners that rebuild states: recompute, rescan)."""

    def __init__(self, executor: ModelExecutor, block_length: int, seed: int = 0, expert_stats: bool = False) -> None:
        self.executor = executor
        self.page_size, self.block_length, self.device = executor.page_size, block_length, executor.device
        self._seed_source = random.Random(seed)
        self._generators: dict[str, torch.Generator] = {}
        self.experts = ExpertTracker(executor.model) if expert_stats else None
        """Routing statistics (`EngineConfig.expert_stats`); None when off."""
        self.structured: StructuredDecoding | None = None
        """Grammar-constrained decoding of requests with structured_outputs (set by the engine if it has a
        tokenizer)."""
        self.prompt_scores: dict[str, list[tuple[int, TokenLogprobs]]] = {}
        """The last step's prompt scores: per request id, (prompt position, logprobs) (engine/prompt_scoring)."""

    @property
    def model(self) -> DiffusionModel:
        return self.executor.model

    @property
    def offload(self) -> ExpertOffload | None:
        return self.executor.offload

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> dict[str, BlockWrite]:
        """Runs the step; returns what it writes into each request's block (requests with a block only)."""
        self.prompt_scores = {}
        batch = self.build_batch(scheduled)
        if not batch.forward.input_ids.numel():
            return {}  # only requests with nothing left to compute (max_tokens 0)
        hidden = self.executor.execute(batch.forward)  # [N, H]
        self._record_experts(batch)
        if batch.scoring is not None and batch.scoring.requests:
            score_rows = torch.tensor(batch.scoring.logit_rows, dtype=torch.long, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, score_rows))
            self.prompt_scores = prompt_logprobs(logits, batch.scoring.requests)
        if not batch.blocks:
            return {}
        logits = self.model.compute_logits(hidden.index_select(0, batch.logit_rows))  # [M, V]
        return {b.work.request.request_id: self._decode(b, logits) for b in batch.blocks}

    def release(self, request_id: str) -> None:
        """Forgets a finished request's generator; its last block's experts still count in the statistics."""
        self._generators.pop(request_id, None)
        self.finish_block(request_id)
        if self.structured is not None and request_id in self.structured.states:
            self.structured.release(request_id)

    def _record_experts(self, batch: StepBatch) -> None:
        """After a forward: the routing statistics of the step's blocks (with expert_stats only)."""
        if self.experts is not None and self.experts.enabled:
            rows = [(b.work.request.request_id, b.token_start, self.block_length) for b in batch.blocks]
            self.experts.record_step(rows)

    def finish_block(self, request_id: str) -> None:
        """The request's block is final: the union of experts it touched counts in the statistics."""
        if self.experts is not None:
            self.experts.finish_block(request_id)

    def shutdown(self) -> None:
        """Stops the worker ranks, if any (idempotent)."""
        self.executor.close()

    # ---- batch building ------------------------------------------------------------------------------------
    def build_batch(self, scheduled: list[ScheduledRequest]) -> StepBatch:
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[torch.Tensor] = []
        sequences: list[SequenceSlice] = []
        blocks: list[BlockRows] = []
        logit_rows: list[int] = []
        for work in scheduled:
            if not work.num_tokens:
                continue  # a request that only scores this step
            request = work.request
            start = len(ids)
            ids += request.known_tokens(work.commit_start, work.commit_end)
            if work.has_block:
                read = self._read_positions(request)
                blocks.append(BlockRows(work, len(ids), len(logit_rows), read))
                logit_rows += [len(ids) + i for i in read]
                ids += request.canvas
            positions += range(work.query_start, work.query_end)
            key_slots = self._key_slots(request.page_ids, work.query_end)
            slot_mapping.append(key_slots[work.query_start :])
            sequences.append(SequenceSlice(start, work.num_tokens, key_slots, self._mask(work)))
        scoring = self._scoring_rows()
        for work in scheduled:
            if work.score_end > work.score_start:
                scoring.add(work, len(ids), self._key_slots)
        ids += scoring.input_ids
        positions += scoring.positions
        slot_mapping += scoring.slot_mapping
        sequences += scoring.sequences
        offload = self._offload_context(blocks) if self.executor.offload is not None else None
        forward = ForwardInputs(
            torch.tensor(ids, device=self.device),
            torch.tensor(positions, device=self.device),
            torch.cat(slot_mapping) if slot_mapping else torch.zeros(0, dtype=torch.long, device=self.device),
            tuple(sequences),
            offload,
        )
        return StepBatch(forward, torch.tensor(logit_rows, dtype=torch.long, device=self.device), blocks, scoring)

    def _scoring_rows(self) -> ScoringRows:
        """An empty set of scoring queries, laid out as this runner's model reads them."""
        return ScoringRows()

    def _read_positions(self, request: Request) -> list[int]:
        """Canvas indices of the request's block whose logits its decoder reads."""
        return DECODERS[request.params.decoder].logit_positions(
            request.masked_indices(), request.generation_start_in_block(), self.block_length
        )

    def _offload_context(self, blocks: list[BlockRows]) -> OffloadContext:
        """The step's blocks as expert offload sees them (built only when offload is on)."""
        return OffloadContext(
            tuple(
                BlockRef(
                    (b.work.request.request_id, b.work.request.block_start),
                    b.token_start,
                    self.block_length,
                    b.work.request.step_in_block == 0,
                )
                for b in blocks
            )
        )

    def _key_slots(self, page_ids: list[int], end: int) -> torch.Tensor:
        """[end] long: cache slot of positions 0..end-1 (page * page_size + offset)."""
        pages = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        offsets = torch.arange(self.page_size, device=self.device)
        return (pages[:, None] * self.page_size + offsets).flatten()[:end]

    def _mask(self, work: ScheduledRequest) -> torch.Tensor | None:
        """Block-causal mask, or None when all queries are one block (they see every key)."""
        if work.num_tokens <= self.block_length:
            return None
        query_positions = torch.arange(work.query_start, work.query_end, device=self.device)
        return block_causal_mask(query_positions, work.query_end, self.block_length)

    # ---- decoding ------------------------------------------------------------------------------------------
    def _decode(self, block: BlockRows, logits: torch.Tensor) -> BlockWrite:
        """What the block's decoder writes this step."""
        request = block.work.request
        params = request.params
        rows = logits[block.logit_start : block.logit_start + len(block.positions)]  # [M, V]
        structured = self.structured if params.structured_outputs is not None else None
        # Unstructured, the mask token keeps its logit: propose counts its mass and never proposes it.
        rows = self._forbid_tokens(request, block.positions, rows, forbid_mask=structured is not None)
        generator = self._generator(request)
        if structured is not None:
            proposal, written = structured.decode(request, rows, block.positions, generator, self.block_length)
            return block_write(proposal, torch.tensor(written, dtype=torch.long, device=self.device))
        decoder = DECODERS[params.decoder]
        positions = torch.tensor(block.positions, dtype=torch.long, device=self.device)
        proposal = propose(
            rows,
            positions,
            self.block_length,
            params,
            generator,
            decoder.needs_entropy,
            params.logprobs,
            request.mask_token_id,
        )
        canvas = torch.tensor(request.canvas, device=self.device)  # [B]
        write = decoder.decide(
            proposal, canvas, canvas == request.mask_token_id, request.step_in_block, params, self.block_length
        )
        return block_write(proposal, write.nonzero().flatten())

    def _forbid_tokens(
        self, request: Request, positions: list[int], rows: torch.Tensor, forbid_mask: bool = True
    ) -> torch.Tensor:
        """rows [M, V]: this block's rows of the step's decode logits, at canvas `positions`, edited in place
        (no other block or reader shares them): the mask token at -inf everywhere unless `forbid_mask` is False
        (then `propose` keeps it out; a position given it would stay masked, and a model that ranks it first, as
        random weights can, would never finish its block), and below min_tokens the stop ids at -inf too."""
        if forbid_mask and 0 <= request.mask_token_id < rows.shape[-1]:
            rows[:, request.mask_token_id] = float("-inf")
        first_generated = request.block_start - request.num_prompt_tokens
        early = [i for i, index in enumerate(positions) if first_generated + index < request.params.min_tokens]
        if early and request.params.stop_ids:
            stop = torch.tensor(sorted(request.params.stop_ids), device=self.device)
            rows[torch.tensor(early, device=self.device)[:, None], stop[None, :]] = float("-inf")
        return rows

    def _generator(self, request: Request) -> torch.Generator | None:
        if request.params.is_greedy:
            return None
        if request.request_id not in self._generators:
            seed = request.params.seed if request.params.seed is not None else self._seed_source.getrandbits(63)
            self._generators[request.request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[request.request_id]


def block_write(proposal: Proposal | None, indices: torch.Tensor) -> BlockWrite:
    """The proposal's tokens at canvas `indices` [W] (and their logprobs, if it has them) as host values."""
    if proposal is None or not indices.numel():
        return BlockWrite([])
    written, tokens = torch.stack([indices, proposal.tokens[indices]]).tolist()  # one transfer
    accepted = list(zip(written, tokens))
    if proposal.logprobs is None:
        return BlockWrite(accepted)
    return BlockWrite(accepted, token_logprobs(proposal.logprobs, proposal.tokens, indices))
