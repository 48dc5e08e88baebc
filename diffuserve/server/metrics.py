"""Prometheus metrics under vLLM's names with a `diffuserve:` prefix, plus the block-diffusion ones (NFE, TPF).

`ServerMetrics` is the engine observer: the engine-loop thread reports requests added, outputs (and, for requests
that take their finished output only, each step's progress), aborts and a stats snapshot after every step, and
this module turns them into gauges, counters and per-request histograms, and for MoE models the expert routing
statistics and the expert-offload cache's hit rate and bytes moved. The series themselves (names, buckets, vLLM
naming) are metric_series.py's.

Latencies in block-diffusion terms (tokens become final a block at a time): TTFT is arrival to the first
committed block; inter-token latency the gap between a request's successive committed blocks, and
time-per-output-token that gap divided by the tokens it brought; queue time is arrival to the end of the first
step the request took part in; prefill time from there to the first committed block; decode time from the
first committed block to the finish; inference time is prefill plus decode; a request's time per output token is
its decode time / (tokens of its longest completion - 1), as vLLM defines it.

Knows nothing of HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.core.outputs import RequestOutput, RequestProgress
from diffuserve.engine.engine_stats import EngineStats
from diffuserve.engine.step_phases import PHASES
from diffuserve.server.bridge import EngineRequest
from diffuserve.server.metric_series import MetricSeries


@dataclass
class _Tracker:
    arrival_time: float
    n: int
    """Completions of the request: an abort counts each one."""
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_tokens: int = 0
    finish_reasons: list[str | None] | None = None
    """Per completion, as of the latest output (a completion may finish before its siblings)."""


class ServerMetrics(MetricSeries):
    """The engine observer (engine-loop thread): requests added, outputs, aborts, a stats snapshot per step."""

    def __init__(self, model_name: str, vllm_names: bool = False, num_kv_pages: int = 0) -> None:
        """`num_kv_pages`: the pool's size (0: unknown; the page counts stay 0)."""
        super().__init__(model_name, vllm_names)
        self._trackers: dict[str, _Tracker] = {}
        self._last: EngineStats | None = None
        self.num_kv_pages = num_kv_pages
        self.kv_pages_total.set(num_kv_pages)

    def request_added(self, request: EngineRequest, arrival_time: float) -> None:
        self._trackers[request.request_id] = _Tracker(arrival_time, request.params.n)
        self.prompt_tokens.inc(len(request.prompt_token_ids))
        self.request_prompt_tokens.observe(len(request.prompt_token_ids))
        self.params_n.observe(request.params.n)
        if request.params.max_tokens is not None:
            self.params_max_tokens.observe(request.params.max_tokens)

    def request_output(self, output: RequestOutput, now: float) -> None:
        tracker = self._trackers.get(output.request_id)
        if tracker is None:
            return
        reasons = [o.finish_reason for o in output.outputs]
        self._advance(tracker, sum(len(o.token_ids) for o in output.outputs), reasons, now)
        if output.finished:
            del self._trackers[output.request_id]
            self._finished(output, tracker, now)

    def request_progress(self, progress: RequestProgress, now: float) -> None:
        """A step of a request that takes its finished output only: counted as an output with its tokens."""
        tracker = self._trackers.get(progress.request_id)
        if tracker is not None:
            self._advance(tracker, progress.num_tokens, progress.finish_reasons, now)

    def _advance(self, tracker: _Tracker, num_tokens: int, finish_reasons: list[str | None], now: float) -> None:
        """A step that ran the request: its first marks it scheduled; new tokens are a TTFT or an ITL."""
        if tracker.scheduled_time is None:
            tracker.scheduled_time = now
            self.queue_time.observe(now - tracker.arrival_time)
        tracker.finish_reasons = finish_reasons
        if num_tokens > tracker.num_tokens:
            if tracker.last_token_time is None:
                tracker.first_token_time = now
                self.ttft.observe(now - tracker.arrival_time)
                self.prefill_time.observe(now - tracker.scheduled_time)
            else:
                self.itl.observe(now - tracker.last_token_time)
                self.tpot.observe((now - tracker.last_token_time) / (num_tokens - tracker.num_tokens))
            tracker.last_token_time, tracker.num_tokens = now, num_tokens

    def _finished(self, output: RequestOutput, tracker: _Tracker, now: float) -> None:
        self.e2e.observe(now - tracker.arrival_time)
        self.request_generation_tokens.observe(tracker.num_tokens)
        assert tracker.scheduled_time is not None
        self.inference_time.observe(now - tracker.scheduled_time)
        if tracker.first_token_time is not None:
            decode = now - tracker.first_token_time
            self.decode_time.observe(decode)
            longest = max(len(o.token_ids) for o in output.outputs)
            if longest > 1:
                self.request_tpot.observe(decode / (longest - 1))
        for completion in output.outputs:
            self.success.labels(finished_reason=completion.finish_reason).inc()
            self.nfe.observe(completion.num_forwards)
            if completion.num_forwards:
                self.tpf.observe(completion.tokens_per_forward)

    def request_aborted(self, request_id: str) -> None:
        """Every completion counts, as a finished request's do: those already finished with their reason."""
        tracker = self._trackers.pop(request_id, None)
        if tracker is None:
            return
        for reason in tracker.finish_reasons or [None] * tracker.n:
            self.success.labels(finished_reason=reason or "abort").inc()

    @property
    def latest_stats(self) -> EngineStats | None:
        """The snapshot of the engine's latest step (None before the first)."""
        return self._last

    def engine_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.kv_pages_used.set(round(stats.kv_usage * self.num_kv_pages))  # usage = 1 - free / total
        self.prefix_hit_rate.set(stats.prefix_hit_rate)
        self.page_hit_rate.set(stats.page_hit_rate)
        if stats.state is not None:
            self.state_slots_used.set(stats.state.slots_used)
            self.state_slots_total.set(stats.state.slots_total)
            self.state_usage.set(stats.state.slots_used / stats.state.slots_total if stats.state.slots_total else 0.0)
            self.state_snapshots.set(stats.state.num_snapshots)
            self.state_hit_rate.set(stats.state.hit_rate)
        last = self._last
        self._last = stats
        if last is None:
            last = stats  # counters start at the server's start, whatever the engine did before
        self.prefix_queries.inc(stats.num_prefix_queried_tokens - last.num_prefix_queried_tokens)
        self.prefix_hits.inc(stats.num_prefix_hit_tokens - last.num_prefix_hit_tokens)
        self.preemptions.inc(stats.num_preemptions - last.num_preemptions)
        self.generation_tokens.inc(stats.num_generated_tokens - last.num_generated_tokens)
        steps = stats.num_steps - last.num_steps
        self.engine_steps.inc(steps)
        for phase in PHASES:
            self.step_phase_seconds.labels(phase=phase).inc(getattr(stats.phases, phase) - getattr(last.phases, phase))
        for _ in range(steps):  # one step per call in practice: its tokens are the batched-token delta
            self.iteration_tokens.observe((stats.num_batched_tokens - last.num_batched_tokens) / steps)
        self._expert_stats(stats, last)
        spec, last_spec = stats.spec_decode, last.spec_decode
        self.spec_drafts.inc(spec.num_drafts - last_spec.num_drafts)
        self.spec_draft_tokens.inc(spec.num_draft_tokens - last_spec.num_draft_tokens)
        self.spec_accepted_tokens.inc(spec.num_accepted_tokens - last_spec.num_accepted_tokens)
        self.spec_acceptance_length.set(spec.mean_acceptance_length)
        auto = self.auto_steps
        auto.labels(mode="verified").inc(spec.num_auto_drafting_steps - last_spec.num_auto_drafting_steps)
        auto.labels(mode="autoregressive").inc(
            spec.num_auto_autoregressive_steps - last_spec.num_auto_autoregressive_steps
        )

    def _expert_stats(self, stats: EngineStats, last: EngineStats) -> None:
        if stats.experts is not None:
            self.experts_per_step.set(stats.experts.experts_touched_per_step)
            self.experts_per_block.set(stats.experts.experts_touched_per_block)
            self.expert_imbalance.set(stats.experts.load_imbalance)
        if stats.offload is not None:
            self.expert_hit_rate.set(stats.offload.hit_rate)
            self.expert_bytes.inc(stats.offload.bytes_moved - (last.offload or stats.offload).bytes_moved)
            self.expert_bytes_per_token.set(stats.expert_bytes_per_generated_token)
