"""LLMEngine: add_request / step / abort over the scheduler and the model runner.

Owns the request table, the n-way fan-out, applying each step's accepted tokens to the requests, finishing
them (stop ids, length, stop strings, aborts, errors) and the cumulative counters the server exports. One
failed step fails only the requests in it; the engine keeps serving the rest.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from diffuserve.config import EngineConfig
from diffuserve.engine.engine_setup import build_components
from diffuserve.engine.output_processor import Completion, ParentRequest
from diffuserve.engine.outputs import RequestOutput
from diffuserve.engine.request import Request, RequestStatus
from diffuserve.engine.scheduler import ScheduledRequest
from diffuserve.engine.stats import EngineCounters, EngineStats
from diffuserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts = build_components(config)
        self.args, self.tokenizer, self.runner = parts.args, parts.tokenizer, parts.runner
        self.scheduler, self.pool = parts.scheduler, parts.pool
        self.max_model_len, self.generation_defaults = parts.max_model_len, parts.generation_defaults
        self.counters = EngineCounters()
        self._parents: dict[str, ParentRequest] = {}
        self._requests: dict[str, Request] = {}  # engine request id -> request
        self._parent_of: dict[str, tuple[ParentRequest, Completion]] = {}

    @property
    def model_dir(self) -> Path:
        return Path(self.config.model)

    # ---- public API ----------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None) -> None:
        """Queues a prompt (text, or token ids) for `params.n` completions. Raises ValueError for bad input."""
        if request_id in self._parents:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        params = (params or SamplingParams()).with_defaults(self.generation_defaults)
        text = prompt if isinstance(prompt, str) else None
        token_ids = self._encode(prompt)
        max_tokens = self._max_tokens(len(token_ids), params)
        stop_ids = self._stop_ids(params)
        completions = [Completion(i, params) for i in range(params.n)]
        parent = ParentRequest(request_id, text, token_ids, completions)
        children = []
        for i in range(params.n):
            child_id = request_id if params.n == 1 else f"{request_id}#{i}"
            child_params = params if params.seed is None else params.replace(seed=params.seed + i)
            children.append(Request(child_id, token_ids, child_params, self.args.block_length,
                                    self.args.mask_token_id, stop_ids, max_tokens))
        self.scheduler.check_fits(children[0])  # all children have the same size; raises before any is queued
        for child, completion in zip(children, completions):
            self._parent_of[child.request_id] = (parent, completion)
            self._requests[child.request_id] = child
            self.scheduler.add(child)
        self._parents[request_id] = parent

    def abort_request(self, request_id: str) -> None:
        """Finishes a request (all its completions) at once and frees its pages. Unknown ids are ignored."""
        parent = self._parents.pop(request_id, None)
        if parent is None:
            return
        for child_id in [c for c, (p, _) in self._parent_of.items() if p is parent]:
            request = self._requests.get(child_id)
            if request is not None and not request.status.is_finished:
                request.status = RequestStatus.FINISHED_ABORTED
                self._finish(request)
            self._requests.pop(child_id, None)
            del self._parent_of[child_id]

    def step(self) -> list[RequestOutput]:
        """Runs one scheduling step and one forward; returns the outputs of requests that progressed."""
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        started = time.perf_counter()
        try:
            results = self.runner.execute(output.scheduled)
        except Exception as e:
            logger.exception("engine step failed; failing its %d requests", len(output.scheduled))
            return self._fail_step(output.scheduled, f"{type(e).__name__}: {e}")
        self.counters.record_step(output.num_batched_tokens, time.perf_counter() - started)
        touched: dict[str, ParentRequest] = {}
        new_counts: dict[str, int] = {}
        for work in output.scheduled:
            new_counts[work.request.request_id] = self._apply(work, results.get(work.request.request_id, []))
            touched[work.request.request_id] = self._parent_of[work.request.request_id][0]
        return self._outputs(touched, new_counts)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def stats(self) -> EngineStats:
        experts = self.runner.experts.snapshot() if self.runner.experts.enabled else None
        offload = self.runner.offload.snapshot() if self.runner.offload is not None else None
        return self.counters.snapshot(self.scheduler, self.pool, experts, offload)

    def shutdown(self) -> None:
        """Stops the worker processes of a multi-process engine (also done at interpreter exit)."""
        self.runner.shutdown()

    # ---- applying a step -----------------------------------------------------------------------------------
    def _apply(self, work: ScheduledRequest, accepted: list[tuple[int, int]]) -> int:
        """Commits, applies the step's tokens, finishes blocks/requests. Returns how many tokens became final.

        NOTE: a block is finished (and so committed by the next forward, fused) only once it is final: for an
        editing decoder that is after a step that changed nothing or once the post-edit budget is spent, so the
        committed K/V are always those of the block's final tokens."""
        request = work.request
        self.scheduler.commit(work)
        prefill_end = min(work.commit_end, request.num_prefill_positions)
        self.counters.num_prefill_tokens += max(0, prefill_end - work.commit_start)
        if not work.has_block:
            if work.commit_end > request.num_prefill_positions:
                request.num_forwards += 1  # a separate commit forward (fused_commit off)
            return 0
        request.num_forwards += 1
        request.step_in_block += 1
        request.apply_step(accepted)
        before = len(request.output_token_ids)
        if request.check_finished() is not None:
            self._finish(request)
        elif request.block_is_final:
            request.finish_block()
            self.runner.experts.finish_block(request.request_id)
        new = len(request.output_token_ids) - before
        self.counters.num_generated_tokens += max(new, 0)
        return new

    def _finish(self, request: Request) -> None:
        """Frees the request's pages and generator; its record stays until its parent's final output."""
        self.scheduler.finish(request)
        self.runner.release(request.request_id)

    def _fail_step(self, scheduled: list[ScheduledRequest], message: str) -> list[RequestOutput]:
        touched = {}
        for work in scheduled:
            work.request.status = RequestStatus.FINISHED_ERROR
            work.request.error = message
            self._finish(work.request)
            touched[work.request.request_id] = self._parent_of[work.request.request_id][0]
        return self._outputs(touched, {})

    def _outputs(self, touched: dict[str, ParentRequest], new_counts: dict[str, int]) -> list[RequestOutput]:
        """Refreshes the completions of the touched requests and snapshots their parents."""
        now = time.monotonic()
        for child_id in touched:
            self._refresh_completion(child_id, now)
        outputs = []
        for parent in {id(p): p for p in touched.values()}.values():
            counts = [new_counts.get(self._child_id(parent, c.index), 0) for c in parent.completions]
            out = parent.snapshot(counts)
            if out.finished:
                parent.metrics.finished_time = now
                self._parents.pop(parent.request_id, None)
                for c in parent.completions:
                    self._parent_of.pop(self._child_id(parent, c.index), None)
                    self._requests.pop(self._child_id(parent, c.index), None)
            outputs.append(out)
        return outputs

    def _refresh_completion(self, child_id: str, now: float) -> None:
        parent, completion = self._parent_of[child_id]
        request = self._requests[child_id]
        status = request.status
        stop_hit = completion.update(self.tokenizer, request.output_token_ids, status.is_finished)
        if stop_hit and not status.is_finished:
            request.status = status = RequestStatus.FINISHED_STOPPED
            self._finish(request)
        out = completion.output
        out.num_forwards, out.error = request.num_forwards, request.error
        if status.is_finished:
            out.finish_reason = status.finish_reason
            if not stop_hit and out.stop_reason is None:
                out.stop_reason = request.stop_reason
        if out.token_ids and parent.metrics.first_token_time is None:
            parent.metrics.first_token_time = now
        parent.num_cached_tokens = request.num_cached_tokens

    # ---- helpers -------------------------------------------------------------------------------------------
    @staticmethod
    def _child_id(parent: ParentRequest, index: int) -> str:
        return parent.request_id if len(parent.completions) == 1 else f"{parent.request_id}#{index}"

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: this model directory has no tokenizer; pass prompt_token_ids")
            return self.tokenizer.encode(prompt)
        vocab = self.args.vocab_size
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} are not token ids of this model (0 <= id < {vocab})")
        return list(prompt)

    def _max_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise ValueError(
                f"prompt: {num_prompt_tokens} tokens leave no room to generate within max_model_len "
                f"{self.max_model_len}; shorten the prompt or raise --max-model-len"
            )
        return min(params.max_tokens or room, room)

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        vocab = self.args.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise ValueError(f"stop_token_ids: {bad[:5]} are not token ids of this model (0 <= id < {vocab})")
        eos = () if params.ignore_eos else self.args.eos_token_ids
        return frozenset((*eos, *params.stop_token_ids))
