"""The model runner of hybrid models (clover_moe: Gated DeltaNet and attention layers). Rank 0: builds the step
batch exactly as the paged runner does (one flattened batch of every request's commit tokens and block), adds
the recurrent-state plan, has the executor run it, applies the decoders.

What differs from the paged families:

  - attention mask: committed tokens are causal (the model's prefix is causal: the GDN state after a position
    only depends on the positions before it); a previewed block sees the commits and itself whole;
  - the state plan (`StatePlan`): which slot each request reads and advances, its commit run (split at a prefix
    snapshot's page boundary), its block, and slots to reset (a request starting at position 0) or restore
    (a prefix-cache hit);
  - logit rows: under the AR shift a position is predicted from the row before it, and a block's first
    position from the slot's `last_hidden` (the last committed position's final hidden state), which is also
    how a checkpoint without the diffusion tensors decodes: autoregressively, one token per step (the block's
    first masked position, read through a causal pass over the block).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import cast

import torch

from diffuserve.engine.decoders import propose
from diffuserve.engine.executor import ModelExecutor, StatePlan
from diffuserve.engine.model_runner import BlockRows, ModelRunner, StepBatch, block_write
from diffuserve.engine.prompt_scoring import ScoringRows, prompt_logprobs
from diffuserve.engine.request import BlockWrite, Request, ScheduledRequest
from diffuserve.model.clover_moe import CloverMoeForBlockDiffusion
from diffuserve.model.clover_moe_config import hybrid_args
from diffuserve.model.layers.gdn_step import RowGroup


class HybridRunner(ModelRunner):
    def __init__(self, executor: ModelExecutor, block_length: int, seed: int = 0, expert_stats: bool = False) -> None:
        super().__init__(executor, block_length, seed, expert_stats)
        hybrid = hybrid_args(self.model.args)
        self.preview = hybrid.has_diffusion
        self.shift = hybrid.prediction_shift or not self.preview  # next-token decoding reads the previous row

    @property
    def model(self) -> CloverMoeForBlockDiffusion:
        # engine_setup builds this runner only for a family with recurrent state: clover_moe, whose model this is
        return cast(CloverMoeForBlockDiffusion, self.executor.model)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> dict[str, BlockWrite]:
        self.prompt_scores = {}
        batch = self.build_batch(scheduled)
        scoring = batch.scoring if batch.scoring is not None and batch.scoring.requests else None
        if not batch.forward.input_ids.numel() and scoring is None:
            return {}  # only requests with nothing left to compute (max_tokens 0)
        cache = self.executor.state_cache
        assert cache is not None, "a hybrid model's executor has a state cache"
        # A step may only score block first positions, read from rows kept by earlier steps: no forward then.
        if batch.forward.input_ids.numel():
            hidden = self.executor.execute(batch.forward)
            self._record_experts(batch)
        else:
            hidden = cache.last_hidden[:0]
        source = torch.cat([hidden, cache.last_hidden])  # row N + slot: that slot's last committed position
        if scoring is not None:
            rows = self._long(scoring.logit_rows)
            self.prompt_scores = prompt_logprobs(
                self.model.compute_logits(source.index_select(0, rows)), scoring.requests
            )
        if not batch.blocks:
            return {}
        logits = self.model.compute_logits(source.index_select(0, batch.logit_rows))  # [M, V]
        decode = self._decode if self.preview else self._next_token
        return {b.work.request.request_id: decode(b, logits) for b in batch.blocks}

    def build_batch(self, scheduled: list[ScheduledRequest]) -> StepBatch:
        batch = super().build_batch(scheduled)
        num_rows = batch.forward.input_ids.shape[0]
        rows = []
        for block in batch.blocks:
            slot = self._state_slot(block.work.request)
            for i in block.positions:
                if not self.shift:
                    rows.append(block.token_start + i)
                else:
                    rows.append(block.token_start + i - 1 if i > 0 else num_rows + slot)
        scoring = batch.scoring
        assert scoring is not None, "the paged runner always builds the step's scoring rows"
        for index, request in scoring.previous_rows:
            scoring.logit_rows[index] = num_rows + self._state_slot(request)
        forward = dataclasses.replace(batch.forward, state=self._state_plan(scheduled, scoring))
        return StepBatch(forward, self._long(rows), batch.blocks, scoring)

    def _scoring_rows(self) -> ScoringRows:
        return ScoringRows(shift=self.shift, causal=not self.preview)

    @staticmethod
    def _state_slot(request: Request) -> int:
        assert request.state_slot is not None, "a running request of a hybrid model holds a state slot"
        return request.state_slot

    # ---- the step's state plan -----------------------------------------------------------------------------
    def _state_plan(self, scheduled: list[ScheduledRequest], scoring: ScoringRows) -> StatePlan:
        commits: dict[tuple[int, int, bool], list[tuple[int, int, int]]] = defaultdict(list)
        previews, reset, restore, last_rows, last_slots = [], [], [], [], []
        start = 0
        for work in scheduled:
            slot = self._state_slot(work.request)
            if work.commit_start == 0:
                reset.append(slot)
            if work.restore_from is not None:
                restore.append((work.restore_from, slot))
            num_commit = work.commit_end - work.commit_start
            for phase, (begin, end, snapshot) in enumerate(self._commit_pieces(work)):
                if end > begin:
                    commits[(phase, end - begin, snapshot >= 0)].append((start + begin, slot, snapshot))
            if num_commit:
                last_rows.append(start + num_commit - 1)
                last_slots.append(slot)
            if work.has_block:
                previews.append((start + num_commit, slot, -1))
            start += work.num_tokens
        for row, request in scoring.variants:
            # A variant previews its request's slot as the block does: it reads the advanced state, never writes it.
            previews.append((row, self._state_slot(request), -1))
        groups = tuple(
            self._group(length, members, has_snapshot) for (_, length, has_snapshot), members in sorted(commits.items())
        )
        blocks = self._group(self.block_length, previews, False) if previews else None
        restored = (self._long([s for s, _ in restore]), self._long([d for _, d in restore])) if restore else None
        return StatePlan(
            groups, blocks, self.preview, self._long(reset), restored, self._long(last_rows), self._long(last_slots)
        )

    @staticmethod
    def _commit_pieces(work: ScheduledRequest) -> list[tuple[int, int, int]]:
        """The commit run as (begin, end, snapshot slot or -1) pieces in batch-relative offsets: split where a
        snapshot is taken, so the state after the first piece can be copied before the second runs."""
        num_commit = work.commit_end - work.commit_start
        if work.snapshot is None:
            return [(0, num_commit, -1)]
        split = work.snapshot.position - work.commit_start
        return [(0, split, work.snapshot.slot), (split, num_commit, -1)]

    def _group(self, length: int, members: list[tuple[int, int, int]], has_snapshot: bool) -> RowGroup:
        """Runs of `length` tokens starting at batch rows members[i][0] of slots members[i][1]."""
        rows = self._long([start for start, _, _ in members])[:, None] + torch.arange(length, device=self.device)
        snapshots = self._long([snap for _, _, snap in members]) if has_snapshot else None
        return RowGroup(rows, self._long([slot for _, slot, _ in members]), snapshots)

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    # ---- attention mask and autoregressive decoding ---------------------------------------------------------
    def _mask(self, work: ScheduledRequest) -> torch.Tensor | None:
        """[Lq, L]: commit rows causal; block rows see everything (preview) or are causal (autoregressive)."""
        num_commit = work.commit_end - work.commit_start
        if self.preview and num_commit == 0:
            return None
        queries = torch.arange(work.query_start, work.query_end, device=self.device)
        mask = torch.arange(work.query_end, device=self.device)[None, :] <= queries[:, None]
        if self.preview:
            mask[num_commit:] = True
        return mask

    def _read_positions(self, request: Request) -> list[int]:
        if self.preview:
            return super()._read_positions(request)
        return request.masked_indices()[:1]

    def _next_token(self, block: BlockRows, logits: torch.Tensor) -> BlockWrite:
        """Autoregressive: the block's first masked position, from the row before it."""
        request = block.work.request
        index = block.positions[0]
        rows = self._forbid_tokens(request, [index], logits[block.logit_start : block.logit_start + 1])
        positions = torch.tensor([index], device=self.device)
        params = request.params
        proposal = propose(
            rows, positions, self.block_length, params, self._generator(request), num_logprobs=params.logprobs
        )
        return block_write(proposal, positions)
