"""LLMEngine: add_request / step / abort over the scheduler, the model runner and the output processor.

A step reads `schedule -> execute -> scheduler.update_from_output -> output_processor.update_completions ->
scheduler.finish_requests -> output_processor.snapshot` (with overlap_outputs, the previous step's
`update_completions` runs on a second thread beside `execute`, and its finishes and snapshot follow `execute`:
engine/output_overlap.py). Who decides what:

- `add_request` is the single authority on a request's validity (request id, prompt token ids, context
  length, stop token ids; the scheduler adds whether it can ever fit the KV cache) and raises the typed errors
  of `diffuserve.errors`; it resolves the request's `SamplingParams` into `ResolvedSamplingParams` and fans it out
  into n engine requests.
- The scheduler applies a step's results (commits, counts, tokens, block completion) and finishes requests on
  a stop id or on length. Every finish goes through `Scheduler.finish_requests` (or its own on stop ids and
  length): that is where a status becomes a finished one.
- The output processor detokenizes and finds stop strings (`update_completions`); the engine finishes those
  requests through the scheduler, as it does aborts, grammar failures and the requests of a failed step, and only
  then has the processor snapshot the outputs: the scheduler is the one owner of "finished".

One failed step fails only the requests in it; the engine keeps serving the rest.

The engine's cumulative counters and their snapshot (what /metrics and `bench` report) are engine/engine_stats.py's.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from diffuserve.config import EngineConfig
from diffuserve.core.adapter_ref import AdapterRef
from diffuserve.core.outputs import RequestOutput, RequestProgress
from diffuserve.core.request import Request, RequestStatus
from diffuserve.core.step import SchedulerOutput, StepUpdate
from diffuserve.engine.completion import Completion
from diffuserve.engine.engine_setup import RunnerFactory, build_components
from diffuserve.engine.engine_stats import EngineCounters, EngineStats
from diffuserve.engine.lora_adapters import LoRAAdapters
from diffuserve.engine.output_overlap import HeldStep, OutputOverlap
from diffuserve.engine.output_processor import OutputProcessor, ParentRequest
from diffuserve.engine.step_phases import StepPhases
from diffuserve.errors import (
    ContextLengthExceeded,
    DuplicateRequestId,
    InvalidTokenIds,
    RequestError,
    UnsupportedParameter,
)
from diffuserve.lora_request import LoRARequest
from diffuserve.sampling_params import ResolvedSamplingParams, SamplingParams

if TYPE_CHECKING:
    from diffuserve.core.cache.paged import PagePool
    from diffuserve.core.cache.recurrent import SlotPool

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, make_runner: RunnerFactory | None = None) -> None:
        """`make_runner`: a benchmark baseline's runner instead of the serving one (bench/baselines)."""
        self.config = config
        parts = build_components(config, make_runner)
        self.args, self.tokenizer, self.runner = parts.args, parts.tokenizer, parts.runner
        self.decoding = parts.decoding
        """Each request's decoder, resolved here once when it is added (the runner decodes with it)."""
        self.scheduler, self.cache = parts.scheduler, parts.cache
        self.max_model_len, self.generation_defaults = parts.max_model_len, parts.generation_defaults
        self.counters = EngineCounters()
        self.output_processor = OutputProcessor(self.tokenizer)
        self.overlap = OutputOverlap(self.output_processor) if config.overlap_outputs else None
        """With overlap_outputs: the outputs thread and the step whose outputs the next step makes."""
        self.last_step_phases = StepPhases()
        """The wall time of each phase of the last step (engine/step_phases.py); zeros for a step that scheduled
        nothing or failed."""
        self.adapters = LoRAAdapters(config.lora, getattr(self.runner.executor, "lora", None))
        """The loaded LoRA adapters (engine/lora_adapters.py); `--lora-modules` are loaded here."""
        for module in config.lora.lora_modules or ():
            self.adapters.load(*module.split("=", 1))

    @property
    def pool(self) -> PagePool:
        """The full-attention page pool."""
        return self.cache.pool

    @property
    def state_pool(self) -> SlotPool | None:
        """The recurrent-state slots (models with GDN layers), else None."""
        return self.cache.slots

    @property
    def model_dir(self) -> Path:
        return Path(self.config.model)

    # ---- public API ----------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        lora_request: LoRARequest | str | None = None,
    ) -> None:
        """Queues a prompt (text, or token ids) for `params.n` completions, with the LoRA adapter `lora_request`
        (a LoRARequest, loaded on first use, or a loaded adapter's name; None: the base model). Raises a
        `RequestError` (a ValueError: ContextLengthExceeded, InvalidTokenIds, DuplicateRequestId, AdapterNotFound,
        ...) for bad input, before anything is queued."""
        if self.output_processor.has_request(request_id):
            raise DuplicateRequestId("request_id", f"{request_id!r} is already in use")
        adapter = self._adapter(lora_request)
        token_ids = self._encode(prompt)
        resolved = self.resolve_params(params, len(token_ids))
        decoder = self.decoding.resolve(resolved)  # the one place a decoder is chosen and checked
        if resolved.is_verified and decoder.name != resolved.decoder:  # a causal-only model: autoregressive
            resolved = resolved.replace(decoder=decoder.name)
        parent = ParentRequest(
            request_id,
            prompt if isinstance(prompt, str) else None,
            token_ids,
            [Completion(i, resolved) for i in range(resolved.n)],
            prompt_logprobs=None if resolved.prompt_logprobs is None else [None] * len(token_ids),
        )
        children = []
        for i in range(resolved.n):
            child_params = resolved if resolved.seed is None else resolved.replace(seed=resolved.seed + i)
            if i > 0:
                child_params = child_params.replace(prompt_logprobs=None)  # the first completion scores the prompt
            children.append(
                Request(parent.child_id(i), token_ids, child_params, self.args.block_length, self.args.mask_token_id)
            )
        for child in children:
            child.adapter = adapter
        self.scheduler.check_fits(children[0])  # all children have the same size; raises before any is queued
        self.output_processor.add_request(parent)
        for child in children:
            self.decoding.assign(child.request_id, decoder)
            self.scheduler.add(child)

    def resolve_params(self, params: SamplingParams | None, num_prompt_tokens: int) -> ResolvedSamplingParams:
        """What a prompt of `num_prompt_tokens` tokens is decoded with: the model's defaults applied, max_tokens
        capped to max_model_len, EOS among the stop ids. Raises ContextLengthExceeded if the prompt leaves no
        room to generate (with max_tokens 0 it may fill the context), InvalidTokenIds for stop token ids outside
        the vocabulary, UnsupportedParameter for prompt_logprobs on a model whose runner cannot score prompts."""
        params = params or SamplingParams()
        room = self.max_model_len - num_prompt_tokens
        if room < (0 if params.max_tokens == 0 else 1):
            raise ContextLengthExceeded(
                "prompt",
                f"{num_prompt_tokens} tokens leave no room to generate within max_model_len "
                f"{self.max_model_len}; shorten the prompt or raise --max-model-len",
            )
        if params.prompt_logprobs is not None and not self.runner.supports_prompt_scoring:
            raise UnsupportedParameter(
                "prompt_logprobs",
                "this engine cannot score prompts (a baseline rebuilding state, sliding-window layers, or renoise "
                "canvases, which have no masked positions to score); remove it",
            )
        if params.stop and self.tokenizer is None:
            raise UnsupportedParameter(
                "stop", "this model directory has no tokenizer to find stop strings with; use stop_token_ids"
            )
        vocab = self.args.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise InvalidTokenIds("stop_token_ids", f"{bad[:5]} are not token ids of this model (0 <= id < {vocab})")
        return params.with_defaults(
            self.generation_defaults,
            max_tokens_limit=room,
            eos_token_ids=self.args.eos_token_ids,
            block_length=self.args.block_length,
        )

    def unload_lora_adapter(self, name: str) -> None:
        """Unloads adapter `name`; AdapterInUse while a waiting or running request runs with it (it is never
        pulled from under a request), AdapterNotFound if it is not loaded."""
        queued = itertools.chain(self.scheduler.waiting, self.scheduler.running)
        self.adapters.unload(name, any(r.adapter is not None and r.adapter.name == name for r in queued))

    def _adapter(self, lora_request: LoRARequest | str | None) -> AdapterRef | None:
        if lora_request is None:
            return None
        if isinstance(lora_request, str):
            return self.adapters.get(lora_request)
        return self.adapters.resolve(lora_request.lora_name, lora_request.lora_path)

    def abort_request(self, request_id: str) -> None:
        """Finishes a request (all its completions) at once and frees its pages. Unknown ids are ignored."""
        self._finish_requests(self.output_processor.abort_request(request_id), RequestStatus.FINISHED_ABORTED)

    def take_progress(self) -> list[RequestProgress]:
        """How far the final-only requests that steps ran since the last call have come (they produce no output
        until they finish): what the server's metrics read of them."""
        return self.output_processor.take_progress()

    def step(self) -> list[RequestOutput]:
        """Runs one scheduling step and one forward; returns the outputs of requests that progressed (with
        `overlap_outputs`, those of the previous step: engine/output_overlap.py). Its phases' wall times are
        `last_step_phases` afterwards (engine/step_phases.py)."""
        started = time.perf_counter()
        self.last_step_phases = StepPhases()  # zeros unless this step runs to its outputs
        output = self.scheduler.schedule()
        held = self.overlap.take() if self.overlap is not None else None
        if output.is_empty:  # nothing to run: the outputs still held are made now
            return self._held_outputs(held)
        scheduled = time.perf_counter()
        try:  # the held step's completions are updated beside the forward
            result = self.runner.execute(output.scheduled, self._beside(held))
        except Exception as e:
            logger.exception("engine step failed; failing its %d requests", len(output.scheduled))
            return self._held_outputs(held) + self._fail_step(output, f"{type(e).__name__}: {e}")
        executed = time.perf_counter()
        outputs = self._held_outputs(held)  # before the update: a stop-string hit drops its request's step
        joined = time.perf_counter()
        update = self.scheduler.update_from_output(output, result.writes, result.verifications)
        if output.num_batched_tokens:  # a step of requests with nothing left to compute ran no forward
            self.counters.record_step(output.num_batched_tokens, executed - scheduled, update)
        self._release(update)
        updated = time.perf_counter()
        self.output_processor.add_prompt_scores(result.prompt_scores)
        for request_id, error in result.failures.items():  # a grammar failure fails its request only
            self._finish_requests([request_id], RequestStatus.FINISHED_ERROR, error)
        this_step = HeldStep(update.requests, update.new_token_counts)
        if self.overlap is not None:
            self.overlap.held = this_step
        else:
            outputs = self._held_outputs(this_step)
        batch, forward, decode = result.phase_seconds or (0.0, executed - scheduled, 0.0)
        outputs_seconds = joined - executed + time.perf_counter() - updated
        self.last_step_phases = StepPhases(
            scheduled - started, batch, forward, decode, updated - joined, outputs_seconds, len(output.scheduled)
        )
        self.counters.phases += self.last_step_phases
        return outputs

    def has_unfinished_requests(self) -> bool:
        """Whether a step has work: requests to run, or (with overlap_outputs) outputs still to make."""
        return self.scheduler.has_unfinished or (self.overlap is not None and self.overlap.held is not None)

    def stats(self) -> EngineStats:
        tracker = self.runner.experts
        experts = tracker.snapshot() if tracker is not None and tracker.enabled else None
        offload = self.runner.offload.snapshot() if self.runner.offload is not None else None
        return self.counters.snapshot(self.scheduler, self.cache, experts, offload)

    def ranks_failure(self) -> str | None:
        """A multi-process engine whose ranks failed (no step can run again): why; else None."""
        return self.runner.executor.ranks_failure()

    def shutdown(self) -> None:
        """Stops the worker processes of a multi-process engine (also done at interpreter exit) and the outputs
        thread."""
        self.runner.shutdown()
        if self.overlap is not None:
            self.overlap.shutdown()

    # ---- helpers -------------------------------------------------------------------------------------------
    def _finish_requests(self, request_ids: list[str], status: RequestStatus, error: str | None = None) -> None:
        """Finishes them through the scheduler and frees their generators in the runner."""
        for request in self.scheduler.finish_requests(request_ids, status, error):
            self.runner.release(request.request_id)

    def _beside(self, held: HeldStep | None) -> Callable[[], None] | None:
        if held is None or self.overlap is None:
            return None
        return functools.partial(self.overlap.launch, held)

    def _held_outputs(self, held: HeldStep | None) -> list[RequestOutput]:
        """The outputs of `held`'s requests: their completions brought up to their tokens (already, or being, by
        the outputs thread when it was started there), the stop-string hits finished, then the snapshot."""
        if held is None:
            return []
        processor = self.output_processor
        hits = held.stop_hits.result() if held.stop_hits is not None else processor.update_completions(held.requests)
        self._finish_requests(hits, RequestStatus.FINISHED_STOPPED)
        return processor.snapshot(held.requests, held.new_token_counts)

    def _fail_step(self, output: SchedulerOutput, error: str) -> list[RequestOutput]:
        """Fails the step's requests (but those a stop string finished meanwhile: engine/output_overlap.py)."""
        requests = [work.request for work in output.scheduled if not work.request.status.is_finished]
        self._finish_requests([r.request_id for r in requests], RequestStatus.FINISHED_ERROR, error)
        return self._held_outputs(HeldStep(requests, {}))

    def _release(self, update: StepUpdate) -> None:
        """The runner's per-request state the step ended: generators of finished requests, expert unions of
        finished blocks."""
        for request in update.finished:
            self.runner.release(request.request_id)
        for request_id in update.finished_blocks:
            self.runner.finish_block(request_id)

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("prompt", "this model directory has no tokenizer; pass prompt_token_ids")
            token_ids, param = self.tokenizer.encode(prompt), "prompt"
        else:
            token_ids, param = list(prompt), "prompt_token_ids"
        vocab = self.args.vocab_size
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise InvalidTokenIds(param, f"{bad[:5]} are not token ids of this model (0 <= id < {vocab})")
        if self.args.mask_token_id in token_ids:  # a committed mask would be read as a position still to decode
            raise InvalidTokenIds(
                param, f"contains the mask token (id {self.args.mask_token_id}), which no prompt may hold; remove it"
            )
        return token_ids
