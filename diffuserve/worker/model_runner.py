"""Runs one engine step on the model (rank 0): builds the flattened batch and each cache kind's metadata, has the
executor run the forward, decodes every block. One runner for every family: what differs between them is data,
the model's `StepRules` (which keys a query sees, which row predicts a position) and its cache layout (which
metadata the step carries: one entry per page group, then the recurrent state, then the canvas rows with their
self-conditioning input, which the runner keeps after decoding).

Input: the scheduler's work list. Output: a `StepResult` (per request, the canvas positions accepted this step
and their tokens, with their logprobs for requests that ask; the prompt scores; the grammar failures). It reads
requests but never changes them (the engine applies results), and it owns the expert statistics. The forward
itself, and under tensor / expert parallelism sending it to the worker ranks, is the executor's.

Batch layout for a step (N query tokens, requests one after another, then prompt-scoring variants):

    input_ids  [ r0 commit tokens | r0 block | r1 block | r2 prefill chunk | ... | variants ]   [N]
    positions  absolute positions of those tokens                                               [N]
    logit rows the rows each block's decoder reads: its masked positions' own rows, or under
               the AR shift the rows before them; a block's first position then reads row
               N + slot, the last committed position's row its state slot keeps              [M]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest, StepResult
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.decoding.step_decoding import DecodedStep, DecodingPlan, StepLogits
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.moe.offload_context import BlockRef, OffloadContext
from diffuserve.model.layers.moe.window_coreset import forward_windows
from diffuserve.model.step_inputs import CanvasInputs
from diffuserve.worker.cache.page_table import PageTableRows
from diffuserve.worker.cache.paged_step import PagedMetadataBuilder, WindowMetadataBuilder
from diffuserve.worker.cache.state_step import StateMetadataBuilder, StatePlan, state_slot
from diffuserve.worker.cache.step_metadata import StepMetadata
from diffuserve.worker.executor import ForwardInputs, ModelExecutor
from diffuserve.worker.experts import ExpertOffload, ExpertTracker
from diffuserve.worker.lora_rows import adapter_slot, token_slots
from diffuserve.worker.prompt_scoring import ScoringRows, prompt_logprobs
from diffuserve.worker.verification import StepDrafts, rejected_slots

LOGITS_BUDGET_BYTES = 1 << 30
"""Default bound on one chunk's fp32 logits (1 GiB: 4 DiffusionGemma canvases of 256 x 262,144)."""


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class BlockRows:
    """Where one request's block sits in the step batch."""

    work: ScheduledRequest
    token_start: int
    """Row of the block's first position in the step batch."""
    positions: list[int]
    """Canvas indices the decoder reads."""


@dataclass(frozen=True)
class StepBatch:
    forward: ForwardInputs
    plan: DecodingPlan
    """What the step decodes (decoding/step_decoding.py)."""
    blocks: list[BlockRows]
    logit_rows: torch.Tensor
    """[M] the source row of each block position's logits, blocks one after another."""
    scoring: ScoringRows
    drafts: StepDrafts = field(default_factory=StepDrafts)
    """The rows and state slots of the drafted blocks the step commits and verifies (decoder=verified)."""


class ModelRunner:
    supports_prompt_scoring = True
    """Whether prompt_logprobs can be computed (not by the benchmark baselines that rebuild state, nor for a model
    with sliding-window layers or renoise canvases)."""

    def __init__(self, executor: ModelExecutor, decoding: BlockDecoding, expert_stats: bool = False) -> None:
        self.executor, self.decoding = executor, decoding
        self.block_length, self.device = decoding.block_length, executor.device
        self.rules = executor.model.step_rules
        # Prompt scoring's variants read the full-attention pages only: a model with window groups cannot score;
        # the block chain rule scores masked positions, and a renoise canvas has none.
        if executor.sizes.windows or self.rules.renoise_canvas:
            self.supports_prompt_scoring = False
        self.has_state = executor.caches.state is not None
        """The model has a RecurrentState cache: each step carries a `StatePlan`."""
        self.state = StateMetadataBuilder(self.block_length, not self.rules.autoregressive, self.device)
        self.experts = ExpertTracker(executor.model) if expert_stats else None
        """Routing statistics (`EngineConfig.expert_stats`); None when off."""
        self.page_tables = {name: PageTableRows(self.device) for name in ["kv", *executor.sizes.windows]}
        """Each page group's page tables, kept across steps (worker/cache/page_table.py)."""
        self.rollback: list[int] = []
        """State slots whose draft the last forward rejected: the next forward puts them back first."""
        self.logits_budget_bytes = LOGITS_BUDGET_BYTES
        """The fp32 logits computed at once: blocks are decoded in chunks of at most this / (4 V) rows."""

    @property
    def model(self) -> DiffusionModel:
        return self.executor.model

    @property
    def offload(self) -> ExpertOffload | None:
        return self.executor.offload

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest], beside: Callable[[], object] | None = None) -> StepResult:
        """Runs the step (see the module docstring). `beside` is called once the batch is built, just before the
        forward: the caller's work that overlaps the forward (engine/output_overlap.py)."""
        started = time.perf_counter()
        batch = self.build_batch(scheduled)
        built = time.perf_counter()
        if beside is not None:
            beside()
        carried = self.executor.carried_rows()  # [slots, H]: the last committed row of each state slot, or [0, H]
        if batch.forward.input_ids.numel():
            hidden = self.executor.execute(batch.forward)  # [N, H]
            self.rollback = []
            hidden = torch.cat([hidden, carried]) if carried.numel() else hidden
            self._record_experts(batch)
        elif batch.scoring.requests or batch.blocks:  # only rows kept from earlier steps are read: no forward
            hidden = carried
        else:
            return StepResult(phase_seconds=(built - started, time.perf_counter() - built, 0.0))  # max_tokens 0
        forwarded = time.perf_counter()
        scores = {}
        if batch.scoring.requests:
            rows = torch.tensor(batch.scoring.logit_rows, dtype=torch.long, device=self.device)
            scores = prompt_logprobs(self.model.compute_logits(hidden.index_select(0, rows)), batch.scoring.requests)
        decoded = self._decode_blocks(batch, hidden)
        if decoded.verdicts:  # verified decoding: the slots of rejected drafts are put back by the next forward
            self.rollback = rejected_slots(scheduled, decoded.verdicts)
        timing = (built - started, forwarded - built, time.perf_counter() - forwarded)
        return StepResult(decoded.writes, scores, decoded.failures, decoded.verdicts, timing)

    def release(self, request_id: str) -> None:
        """Forgets a finished request's decoding state; its last block's experts still count in the statistics."""
        self.decoding.release(request_id)
        self.finish_block(request_id)
        for tables in self.page_tables.values():
            tables.release(request_id)

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
        blocks: list[BlockRows] = []
        drafts = StepDrafts()
        groups = self._page_groups()
        paged = groups[0]  # the full-attention pages: what prompt scoring's variants read
        plan = self.decoding.plan(scheduled)
        runs: list[tuple[int, int]] = []  # (first row, adapter slot) of each run of rows
        lora = self.executor.lora
        draft_slot = lora.draft_slot if lora is not None else None
        for work in scheduled:
            num_tokens = work.num_tokens
            if not (num_tokens or work.has_block):
                continue  # a request that only scores this step
            request = work.request
            if lora is not None:
                runs.append((len(ids), adapter_slot(request)))
            for group in groups if num_tokens else ():  # a block that is not computed has no keys to lay
                group.add(work, len(ids))
            if request.request_id in plan.drafts:
                drafts.add(work, len(ids), plan.drafts[request.request_id].positions)
            ids += request.known_tokens(work.commit_start, work.commit_end)
            if work.has_block:
                block = plan.blocks[request.request_id]
                blocks.append(BlockRows(work, len(ids), block.read))
                if draft_slot is not None and request.adapter is None and request.rule.verifies_heads:
                    runs.append((len(ids), draft_slot))  # drafting rows only: the causal rows stay the base's
                ids += block.tokens
            positions += range(work.commit_start, work.commit_start + num_tokens)  # its queries
        scoring = ScoringRows(shift=self.rules.prediction_shift, causal=self.rules.autoregressive)
        for work in scheduled:
            if work.score_end > work.score_start:
                scoring.add(work, len(ids), paged.key_slots)
        ids += scoring.input_ids
        positions += scoring.positions
        for slot_mapping, sequence in zip(scoring.slot_mapping, scoring.sequences):
            paged.add_sequence(slot_mapping, sequence)
        num_rows = len(ids)
        for index, request in scoring.previous_rows:
            scoring.logit_rows[index] = num_rows + state_slot(request)
        metadata = StepMetadata(
            {group.group: group.build() for group in groups},
            self._state_plan(scheduled, scoring.variants, drafts) if self.has_state else None,
            self._canvas_inputs(blocks) if self.executor.caches.canvas is not None else None,
        )
        forward = ForwardInputs(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            metadata,
            self._block_context(blocks, positions)
            if self.executor.offload is not None or self.executor.block_coreset
            else None,
            self._token_slots(runs, scoring, num_rows),
        )
        rows = [row for block in blocks for row in self._logit_rows(block, num_rows)]
        logit_rows = torch.tensor(rows, dtype=torch.long, device=self.device)
        return StepBatch(forward, plan, blocks, logit_rows, scoring, drafts)

    def _token_slots(self, runs: list[tuple[int, int]], scoring: ScoringRows, num_rows: int) -> torch.Tensor | None:
        """The adapter slot of each of the step's rows (None without adapters, or when no row has one)."""
        if self.executor.lora is None:
            return None
        variants = [(row, adapter_slot(request)) for row, request in scoring.variants]
        return token_slots(runs + variants, num_rows, self.device)

    def _page_groups(self) -> list[PagedMetadataBuilder]:
        """A metadata builder per page group, in the executor's order: the full-attention pages, then each
        sliding-window group."""
        args = (self.executor.page_size, self.block_length, self.rules, self.device)
        windows = self.executor.sizes.windows
        tables = self.page_tables
        return [PagedMetadataBuilder("kv", *args, tables["kv"])] + [
            WindowMetadataBuilder(name, window, *args, tables[name]) for name, (window, _) in windows.items()
        ]

    def plan_state(self, scheduled: list[ScheduledRequest], variants: list[tuple[int, Request]]) -> StatePlan:
        """The step's recurrent-state plan; `variants`: each scoring variant's first row and request."""
        return self.state.plan(scheduled, variants)

    def _state_plan(
        self, scheduled: list[ScheduledRequest], variants: list[tuple[int, Request]], drafts: StepDrafts
    ) -> StatePlan:
        """The state plan, with the slots verified decoding saves before the forward or puts back first."""
        plan = self.plan_state(scheduled, variants)
        if not (self.rollback or drafts.slots):
            return plan
        slots = [  # the slots to put back, then those to save
            torch.tensor(s, dtype=torch.long, device=self.device) if s else None for s in (self.rollback, drafts.slots)
        ]
        return replace(plan, rollback=slots[0], backup=slots[1])

    def _canvas_inputs(self, blocks: list[BlockRows]) -> CanvasInputs:
        """The step's canvas rows and each canvas's self-conditioning input (zeros at a canvas's first step)."""
        assert self.executor.caches.canvas is not None, "a model with a canvas state"
        rows = [b.token_start + i for b in blocks for i in range(self.block_length)]
        slots = [canvas_slot(b.work.request) for b in blocks]
        first_steps = [b.work.request.step_in_block == 0 for b in blocks]
        return self.executor.caches.canvas.inputs(rows, slots, first_steps)

    def _logit_rows(self, block: BlockRows, num_rows: int) -> list[int]:
        """The rows predicting the block's read positions: their own, or (AR shift) the previous position's, the
        block's first position's being its slot's kept row."""
        if not self.rules.prediction_shift:
            return [block.token_start + i for i in block.positions]
        first = num_rows + state_slot(block.work.request) if 0 in block.positions else -1
        return [block.token_start + i - 1 if i > 0 else first for i in block.positions]

    def _block_context(self, blocks: list[BlockRows], positions: list[int]) -> OffloadContext:
        """The step's blocks as expert offload and coreset routing see them (built only when one is on), and its
        windows where the coreset rule applies to every window."""
        rule = self.executor.block_coreset
        return OffloadContext(
            tuple(
                BlockRef(
                    (b.work.request.request_id, b.work.request.block_start),
                    b.token_start,
                    self.block_length,
                    b.work.request.step_in_block == 0,
                )
                for b in blocks
                if b.work.forwards_block
            ),
            forward_windows(positions, rule.window) if rule is not None and rule.every_window else (),
        )

    def _record_experts(self, batch: StepBatch) -> None:
        """After a forward: the routing statistics of the step's blocks (with expert_stats only)."""
        if self.experts is not None and self.experts.enabled:
            blocks = [b for b in batch.blocks if b.work.forwards_block]
            rows = [(b.work.request.request_id, b.token_start, self.block_length) for b in blocks]
            self.experts.record_step(rows)

    # ---- decoding ------------------------------------------------------------------------------------------
    def _decode_blocks(self, batch: StepBatch, hidden: torch.Tensor) -> DecodedStep:
        """hidden [N, H] -> the step's decoding (the drafts checked, the blocks decoded), with where each block's
        and each draft's rows are; the fp32 logits alive at once are at most `logits_budget_bytes`."""
        max_rows = self.logits_budget_bytes // (4 * max(self.decoding.vocab_size, 1))
        rows = batch.drafts.rows
        draft_rows = torch.tensor(rows, dtype=torch.long, device=self.device) if rows else batch.logit_rows[:0]
        logits = StepLogits(hidden, batch.logit_rows, draft_rows, self.model.compute_logits, max_rows)
        return self.decoding.decode(batch.plan, logits, self._keep_self_conditioning)

    def _keep_self_conditioning(self, carried: list[tuple[Request, torch.Tensor]]) -> None:
        """The next step's self-conditioning input of every canvas that goes on (its [C, V] tempered logits), in
        one batched pass."""
        assert self.executor.caches.canvas is not None, "renoise canvases keep their input in the canvas pool"
        soft = self.model.self_conditioning_input(torch.cat([logits for _, logits in carried]))  # [k x C, H]
        self.executor.caches.canvas.keep([canvas_slot(request) for request, _ in carried], soft)


def canvas_slot(request: Request) -> int:
    assert request.canvas_slot is not None, "a running request of a model with a canvas state holds a slot"
    return request.canvas_slot
