"""Step-level continuous batching for block diffusion. Torch-free.

NOTE: the framing is vLLM's, adapted to diffusion. A request has `num_computed_tokens` (final K/V in the cache)
and a current block. One engine step spends a token budget (`max_num_batched_tokens`) on, per request:

    commit tokens  [num_computed_tokens, block_start)   prompt blocks (prefill, chunked by whole blocks) or
                                                         the block finished last step (the fused commit)
    + its current block (block_length tokens)            denoised this step, once nothing is left to commit

Prefill (a prompt's blocks, or a preempted request's recompute: any commit but the one block a decode step
commits) also spends a smaller budget of its own, `max_prefill_tokens`, while any running request is decoding, so
that a step which prefills arriving prompts beside them stays short: their inter-token latency is the step's time.
With none decoding, prefill may take the whole step. Running requests
come first, least recently scheduled first (so a tight budget rotates among them); waiting requests are admitted
FCFS after them while pages, budgets and `max_num_seqs` allow. When pages run out, the most
recently admitted running request is preempted: its pages are freed, its tokens and canvas kept, and it is
recomputed later. A request is only admitted if its whole life fits in the cache, so the oldest request can
always proceed: no deadlock. Which memory a request holds (pages of K/V, a sliding window of them, a
recurrent-state slot) is the cache manager's business (core/cache): the scheduler asks it whether work fits,
to take it, to reuse a prefix and to give everything back, and never learns which kinds a model has.

After the forward, `update_from_output` applies the step to the requests (commits, NFE counts, the accepted
tokens, block completion) and finishes those whose tokens end them (a stop id, or the length).
`finish_requests` is the one place a request's status becomes a finished one: for those, for the stop strings
the output processor finds, for aborts and for failed steps. Knows nothing of text, tokenizers or the model.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping

from diffuserve.core.cache.manager import CacheManager
from diffuserve.core.draft_switch import CPU_DRAFT_COST, DraftSwitch, back_off
from diffuserve.core.request import Request, RequestStatus
from diffuserve.core.step import ScheduledRequest, SchedulerOutput, StepUpdate
from diffuserve.core.step_budget import StepBudget, is_prefill
from diffuserve.core.verification import apply_head, apply_verification, end_at_head
from diffuserve.core.verification_trace import record_check
from diffuserve.core.writes import BlockWrite, Verification

NO_WRITE = BlockWrite([])
"""A step that wrote nothing into a request's block (a grammar failure, or no result for it)."""


class Scheduler:
    def __init__(
        self,
        cache: CacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        block_length: int,
        fused_commit: bool = True,
        forward_blocks: bool = True,
        auto_draft_tokens: int = 0,
        max_prefill_tokens: int | None = None,
        auto_draft_cost: float = CPU_DRAFT_COST,
    ) -> None:
        """`forward_blocks` False: no block's tokens are computed (`ScheduledRequest.forwards_block`);
        `auto_draft_tokens`: the step tokens up to which decoder=auto requests draft (core/draft_switch.py);
        `max_prefill_tokens`: the prefill tokens of one step (None: only `max_num_batched_tokens` bounds them);
        `auto_draft_cost`: a drafting forward's cost in autoregressive ones (core/draft_switch.py)."""
        self.cache = cache
        self.drafts = DraftSwitch(block_length, auto_draft_tokens, auto_draft_cost)
        self.num_auto = 0
        """Unfinished decoder=auto requests (the switch is consulted only while there are some)."""
        self.forward_blocks = forward_blocks
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_prefill_tokens = max_num_batched_tokens if max_prefill_tokens is None else max_prefill_tokens
        self.block_length = block_length
        self.fused_commit = fused_commit
        self.requests: dict[str, Request] = {}
        """Unfinished requests by id."""
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is preempted first
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        """Prompt tokens reused from the prefix cache (every cache kind restored: pages, a state snapshot)."""
        self.num_prefix_page_hit_tokens = 0
        """Prompt tokens whose full-attention pages the prefix cache held (other kinds may reuse fewer)."""

    # ---- public API ----------------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queues a request. Raises ContextLengthExceeded if it could never fit in the KV cache."""
        self.check_fits(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.num_auto += request.params.is_auto

    def check_fits(self, request: Request) -> None:
        """Raises ContextLengthExceeded if the request's whole life needs more than the cache has."""
        self.cache.check_fits(request)

    def schedule(self) -> SchedulerOutput:
        """Picks this step's work and allocates its pages. Mutates request statuses, pages and queues."""
        self.num_steps += 1
        self.cache.start_step()
        budget = StepBudget(self.max_num_batched_tokens, self._prefill_budget())
        if self.num_auto:  # decoder=auto requests: whether they draft this step
            seats = max(0, self.max_num_seqs - len(self.running))  # the waiting requests this step may admit
            self.drafts.choose(itertools.chain(self.running, itertools.islice(self.waiting, seats)))
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        for request in sorted(self.running, key=lambda r: r.last_scheduled_step):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            target = request.commit_target
            prefill = is_prefill(request, target)
            work = self._plan(request, budget, prefill, target)
            if work is None or not self._reserve(work, scheduled, preempted):
                continue
            scheduled.append(self.cache.allocate(work))
            budget.spend(work, prefill)
        if not preempted:
            self._admit_waiting(budget, scheduled)
        for work in scheduled:
            work.request.last_scheduled_step = self.num_steps
        return SchedulerOutput(scheduled, preempted)

    def update_from_output(
        self,
        output: SchedulerOutput,
        writes: Mapping[str, BlockWrite],
        verifications: Mapping[str, Verification] | None = None,
    ) -> StepUpdate:
        """Applies a step's results: `writes` holds, per request with a block, the (canvas index, token) pairs
        the decoder wrote (and their logprobs, for requests that ask); `verifications`, per request whose drafted
        block this step committed, what its causal rows kept (core/verification.py). Commits, counts forwards,
        applies the verification, writes the tokens, then finishes the request (stop id, length) or, if its block
        is final, opens the next block. A rejected draft discards the block step that assumed it.

        NOTE: a block is finished (and so committed by the next forward, fused) only once it is final: for an
        editing decoder that is after a step that changed nothing or once the post-edit budget is spent, so the
        committed K/V are always those of the block's final tokens."""
        update, now = StepUpdate(), time.monotonic()
        verifications = verifications or {}
        for work in output.scheduled:
            request = work.request
            if request.status.is_finished:  # a stop string the previous step's text reached (output overlap)
                continue
            self.cache.apply(work)
            self._end_scoring(work, update)
            update.num_prefill_tokens += max(0, min(work.commit_end, request.num_prefill_positions) - work.commit_start)
            before = len(request.output_token_ids)
            verdict = verifications.get(request.request_id)
            rejected = verdict is not None and self._apply_verification(work, verdict, update)
            if work.has_block and not rejected:
                self._apply_block(work, writes.get(request.request_id, NO_WRITE), update)
            elif work.has_block or work.commit_end > request.num_prefill_positions:
                request.num_forwards += 1  # a separate commit forward (fused_commit off), or a discarded step
            update.requests.append(request)
            new = len(request.output_token_ids) - before
            if new > 0 and request.first_token_time is None:
                request.first_token_time = now
            update.new_token_counts[request.request_id] = new
            update.num_generated_tokens += max(new, 0)
        return update

    def finish_requests(self, request_ids: list[str], status: RequestStatus, error: str | None = None) -> list[Request]:
        """Gives the unfinished ones among `request_ids` the final `status` (and `error`), frees their pages
        and forgets them. Unknown or already finished ids are skipped. Returns the requests it finished."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            request.error = error
            self._finish(request, status)
            finished.append(request)
        return finished

    @property
    def prefix_hit_rate(self) -> float:
        """Share of the reusable prompt tokens of admitted requests that came from the prefix cache."""
        return self.num_prefix_hit_tokens / self.num_prefix_queried_tokens if self.num_prefix_queried_tokens else 0.0

    @property
    def page_hit_rate(self) -> float:
        """Share of the reusable prompt tokens of admitted requests whose pages the prefix cache held."""
        queried = self.num_prefix_queried_tokens
        return self.num_prefix_page_hit_tokens / queried if queried else 0.0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- applying a step ------------------------------------------------------------------------------------
    def _apply_block(self, work: ScheduledRequest, write: BlockWrite, update: StepUpdate) -> None:
        """A denoising step of the request's block."""
        request = work.request
        request.num_forwards += 1
        request.step_in_block += 1
        if work.head_only and request.draft.skip:  # a step of an auto request's backoff (core/draft_switch.py)
            request.draft.skip -= 1
        request.apply_step(write.accepted, write.logprobs, write.final)
        if write.head is not None:
            apply_head(request, write.head)
        if self._stop_check(request, update):
            return
        if write.head is not None and (work.head_only or request.draft.end == request.block_end):
            # Only the head was decided (auto without drafts), or it is the whole block (block length 1): nothing
            # is left to check, so the block ends as output at its head. (No head written: a grammar failure.)
            end_at_head(request)
            update.finished_blocks.append(request.request_id)
        elif request.block_is_final and not work.head_only:
            request.finish_block()
            update.finished_blocks.append(request.request_id)

    def _stop_check(self, request: Request, update: StepUpdate) -> bool:
        """Finishes the request if its tokens end it; returns whether they did."""
        stop = request.stop_check()
        if stop is not None:
            request.apply_stop(stop)
            self._finish(request, stop.status)
            update.finished.append(request)
        return stop is not None

    def _apply_verification(self, work: ScheduledRequest, verdict: Verification, update: StepUpdate) -> bool:
        """The step committed the request's drafted block: keeps what its causal rows verified. A rejection
        takes the caches back to the draft's start (its kept tokens are committed again). The verified tokens may
        end the request on a stop id or the length. Returns whether the draft was rejected."""
        request = work.request
        block = request.block_start - self.block_length
        update.num_draft_tokens += verdict.num_checked
        update.num_accepted_tokens += verdict.num_accepted
        update.num_verified_blocks += 1
        if request.params.record_denoising:
            record_check(request, verdict)
        rejected = apply_verification(request, verdict)
        if request.params.is_auto:  # drafts that do not pay pause the next ones (core/draft_switch.py)
            back_off(request.draft, verdict, self.drafts.draft_cost)
        if rejected:
            self.cache.rollback(request, block)
            update.num_discarded_steps += int(work.has_block)
        if rejected or not work.has_block:  # else the block step that follows checks the stops
            self._stop_check(request, update)
        return rejected

    def _end_scoring(self, work: ScheduledRequest, update: StepUpdate) -> None:
        """After the forward: the scored positions advance the cursor (the cache took its scratch pages back); a
        request with max_tokens 0 finishes (length, no tokens) once its prompt is scored."""
        request = work.request
        request.score_cursor = max(request.score_cursor, work.score_end)
        if request.params.max_tokens == 0 and not request.num_unscored:
            self._finish(request, RequestStatus.FINISHED_LENGTH)
            update.finished.append(request)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """The one transition into a finished status: the request leaves the queues and its pages are freed."""
        request.status = status
        del self.requests[request.request_id]
        self.num_auto -= request.params.is_auto
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.cache.release(request)

    # ---- planning ------------------------------------------------------------------------------------------
    def _prefill_budget(self) -> int:
        """`max_prefill_tokens` while a running request is decoding (its next tokens wait for the step), else the
        whole step."""
        if any(not is_prefill(request) for request in self.running):
            return self.max_prefill_tokens
        return self.max_num_batched_tokens

    def _plan(self, request: Request, step_budget: StepBudget, prefill: bool, target: int) -> ScheduledRequest | None:
        """The largest piece of work that fits the budget: pending commits (all, or a chunk of whole blocks, within
        the prefill budget if they are prefill), the prompt positions those commits let it score
        (prompt_logprobs), then the block once nothing is left to commit or score. With fused_commit off, a
        finished block's commit runs as its own forward. A request with max_tokens 0 has no block: once scored it
        gets an empty piece of work, which finishes it. `target`: the request's commit target."""
        budget = step_budget.tokens
        commit_budget = min(budget, step_budget.prefill_tokens) if prefill else budget
        start = request.num_computed_tokens
        pending = max(0, target - start)
        limit = self.cache.commit_limit(request, target) - start
        chunk = min(pending, commit_budget // self.block_length * self.block_length, max(limit, 0))
        score_start, score_end = self._plan_scoring(request, start + chunk, budget - chunk)
        left = budget - chunk - (score_end - score_start) * self.block_length
        is_block_commit = request.block_start > request.num_prefill_positions
        has_block = (
            chunk == pending
            and start + chunk == request.block_start
            and self.block_length <= left
            and request.params.max_tokens > 0
            and request.block_start < request.num_prompt_tokens + request.params.max_tokens  # a draft may end it
            and score_end - score_start == request.num_unscored
            and not (pending and is_block_commit and not self.fused_commit)
        )
        if not (chunk or score_end > score_start or has_block or request.params.max_tokens == 0):
            return None
        head_only = request.params.is_auto and not self.drafts.lets_draft(request)
        return ScheduledRequest(
            request,
            start,
            start + chunk,
            has_block,
            score_start=score_start,
            score_end=score_end,
            head_only=head_only,
            forwards_block=self.forward_blocks and not head_only,
        )

    def _plan_scoring(self, request: Request, commit_end: int, budget: int) -> tuple[int, int]:
        """Prompt positions to score this step: the next ones whose earlier blocks are committed by `commit_end`
        (the variants read those K/V in the same forward, as a fused commit's block does), B tokens each."""
        cursor = request.score_cursor
        if not request.num_unscored:
            return cursor, cursor
        ready = min(request.num_prompt_tokens, commit_end + self.block_length)  # commit_end is block-aligned
        return cursor, cursor + max(0, min(ready - cursor, budget // self.block_length))

    def _reserve(self, work: ScheduledRequest, scheduled: list, preempted: list[Request]) -> bool:
        """Makes room for `work`, preempting the youngest unscheduled running requests while the cache is short.
        Returns False if `work`'s own request had to be preempted."""
        while not self.cache.can_allocate(work):
            busy = {s.request.request_id for s in scheduled}
            victims = [r for r in self.running if r.request_id not in busy]
            victim = victims[-1]  # `work.request` itself is among them, so never empty
            self._preempt(victim)
            preempted.append(victim)
            if victim is work.request:
                return False
        return True

    def _admit_waiting(self, budget: StepBudget, scheduled: list[ScheduledRequest]) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            page_hits = self.cache.match_prefix(request)
            target = request.commit_target  # after the prefix match, which may have reused its prompt
            prefill = is_prefill(request, target)
            work = self._plan(request, budget, prefill, target)
            if work is None or not self.cache.can_allocate(work):
                self.cache.release(request)  # drop the prefix again; retry next step
                break
            self.waiting.popleft()
            work = self.cache.allocate(work)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.num_prefix_queried_tokens += request.block_start // self.cache.page_size * self.cache.page_size
            self.num_prefix_hit_tokens += request.num_computed_tokens
            self.num_prefix_page_hit_tokens += page_hits
            if request.num_forwards == 0:
                request.num_cached_tokens = request.num_computed_tokens
            scheduled.append(work)
            budget.spend(work, prefill)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.cache.release(request)
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions += 1
