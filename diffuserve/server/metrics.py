"""Prometheus metrics under vLLM's names with a `diffuserve:` prefix, plus the block-diffusion ones (NFE, TPF).

`ServerMetrics` is the engine observer: the engine-loop thread reports requests added, outputs, aborts and a
stats snapshot after every step, and this module turns them into gauges, counters and per-request histograms,
and for MoE models the expert routing statistics and the expert-offload cache's hit rate and bytes moved. Every
metric is labelled `model_name`. Each server owns its own registry (with the `process_*` and `python_*` series of
prometheus_client's collectors), so several servers can live in one process.

Latencies in block-diffusion terms (tokens become final a block at a time): TTFT is arrival to the first
committed block; inter-token latency the gap between a request's successive committed blocks, and
time-per-output-token that gap divided by the tokens it brought; queue time is arrival to the end of the first
step the request took part in; prefill time from there to the first committed block; decode time from the
first committed block to the finish; inference time is prefill plus decode; a request's time per output token is
its decode time / (tokens of its longest completion - 1), as vLLM defines it.

With `vllm_names`, the series vLLM also exports are named `vllm:...` instead of `diffuserve:...`, so that
dashboards made for vLLM work unchanged; the diffusion-only ones keep their `diffuserve:` names.
Knows nothing of HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from diffuserve.engine.llm_engine import EngineStats
from diffuserve.engine.output_processor import RequestOutput
from diffuserve.server.bridge import EngineRequest

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
TPF_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)
PREFIX = "diffuserve:"
VLLM_PREFIX = "vllm:"
VLLM_SERIES = frozenset(
    {
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
        "request_success",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_time_per_output_token_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "iteration_tokens_total",
        "request_params_n",
        "request_params_max_tokens",
    }
)
"""The series vLLM exports under the same name and meaning (`--metrics-vllm-names` renames them `vllm:...`)."""
N_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)

disable_created_metrics()  # no `*_created` series next to every counter (vLLM does the same)


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


class ServerMetrics:
    def __init__(self, model_name: str, vllm_names: bool = False) -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self._trackers: dict[str, _Tracker] = {}
        self._last: EngineStats | None = None

        def make(kind: type, name: str, doc: str, labels: tuple[str, ...] = (), **kwargs: object) -> Any:
            prefix = VLLM_PREFIX if vllm_names and name in VLLM_SERIES else PREFIX
            metric = kind(prefix + name, doc, ("model_name", *labels), registry=self.registry, **kwargs)
            return metric.labels(model_name=model_name) if not labels else _Bound(metric, model_name)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled (incl. preempted).")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV-cache pages in use (1 = 100 %).")
        self.prefix_hit_rate = make(
            Gauge,
            "prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache / prompt tokens looked up, since start.",
        )
        self.prefix_queries = make(Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = make(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.page_hit_rate = make(
            Gauge,
            "prefix_cache_page_hit_rate",
            "Prompt tokens whose KV pages the prefix cache held / prompt tokens looked up, since start.",
        )
        self.preemptions = make(Counter, "num_preemptions", "Requests preempted (pages freed, recomputed later).")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of accepted requests.")
        self.generation_tokens = make(Counter, "generation_tokens", "Generated tokens made final.")
        self.engine_steps = make(Counter, "engine_steps", "Forwards the engine ran (one per step, whole batch).")
        self.rejected = make(Counter, "requests_rejected", "Requests refused before reaching the engine.", ("reason",))
        self.success = make(Counter, "request_success", "Finished completions.", ("finished_reason",))
        self.ttft = make(
            Histogram, "time_to_first_token_seconds", "Arrival to first committed block.", buckets=LATENCY_BUCKETS
        )
        self.itl = make(
            Histogram,
            "inter_token_latency_seconds",
            "Gap between a request's successive committed blocks (several tokens arrive at once).",
            buckets=LATENCY_BUCKETS,
        )
        self.tpot = make(
            Histogram,
            "time_per_output_token_seconds",
            "Gap between a request's successive committed blocks / the tokens the later one brought.",
            buckets=LATENCY_BUCKETS,
        )
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to finish.", buckets=LATENCY_BUCKETS)
        self.queue_time = make(
            Histogram,
            "request_queue_time_seconds",
            "Arrival to the end of the first step the request took part in.",
            buckets=LATENCY_BUCKETS,
        )
        self._add_phase_metrics(make)
        self.request_prompt_tokens = make(
            Histogram, "request_prompt_tokens", "Prompt length per request.", buckets=TOKEN_BUCKETS
        )
        self.request_generation_tokens = make(
            Histogram,
            "request_generation_tokens",
            "Generated tokens per request (all its completions).",
            buckets=TOKEN_BUCKETS,
        )
        self.nfe = make(
            Histogram, "request_num_forwards", "NFE: denoising forwards per completion.", buckets=TOKEN_BUCKETS
        )
        self.tpf = make(
            Histogram, "tokens_per_forward", "TPF: generated tokens / NFE, per completion.", buckets=TPF_BUCKETS
        )
        self._add_expert_metrics(make)
        self._add_state_metrics(make)

    def _add_state_metrics(self, make: Any) -> None:
        """Hybrid models' recurrent-state pool (set only for models with GDN layers)."""
        self.state_slots_used = make(Gauge, "state_slots_used", "Recurrent-state slots held by running requests.")
        self.state_slots_total = make(Gauge, "state_slots_total", "Recurrent-state slots in the pool.")
        self.state_snapshots = make(Gauge, "state_prefix_snapshots", "Slots holding a prefix-cache state snapshot.")
        self.state_hit_rate = make(
            Gauge,
            "prefix_cache_state_hit_rate",
            "Prompt tokens restored from a state snapshot (with their pages) / prompt tokens looked up, since start.",
        )

    def _add_phase_metrics(self, make: Any) -> None:
        """Per-request phases and parameters, and tokens per engine step (vLLM's series)."""
        self.prefill_time = make(
            Histogram,
            "request_prefill_time_seconds",
            "First step to the first committed block.",
            buckets=LATENCY_BUCKETS,
        )
        self.decode_time = make(
            Histogram, "request_decode_time_seconds", "First committed block to finish.", buckets=LATENCY_BUCKETS
        )
        self.inference_time = make(
            Histogram, "request_inference_time_seconds", "First step to finish.", buckets=LATENCY_BUCKETS
        )
        self.request_tpot = make(
            Histogram,
            "request_time_per_output_token_seconds",
            "Decode time / (tokens of the longest completion - 1), per request.",
            buckets=LATENCY_BUCKETS,
        )
        self.iteration_tokens = make(
            Histogram,
            "iteration_tokens_total",
            "Tokens in one engine step (blocks, commits and prefill chunks of the whole batch).",
            buckets=TOKEN_BUCKETS,
        )
        self.params_n = make(Histogram, "request_params_n", "The n of each request.", buckets=N_BUCKETS)
        self.params_max_tokens = make(
            Histogram,
            "request_params_max_tokens",
            "The max_tokens of each request that set one.",
            buckets=TOKEN_BUCKETS,
        )

    def _add_expert_metrics(self, make: Any) -> None:
        """MoE routing statistics and the expert-offload cache (set only for models and engines that have them)."""
        self.experts_per_step = make(
            Gauge,
            "experts_touched_per_step",
            "Distinct experts per MoE layer per step (whole batch), averaged since start.",
        )
        self.experts_per_block = make(
            Gauge,
            "experts_touched_per_block",
            "Distinct experts per MoE layer over one block's denoising steps, averaged since start.",
        )
        self.expert_imbalance = make(
            Gauge,
            "expert_load_imbalance",
            "Max / mean tokens over the touched experts of a layer-step, averaged since start (1 = even).",
        )
        self.expert_hit_rate = make(
            Gauge,
            "expert_cache_hit_rate",
            "Expert offload: routed (token, expert) pairs served by a device-resident expert / all pairs, since start.",
        )
        self.expert_bytes = make(
            Counter,
            "expert_offload_bytes",
            "Expert offload: expert weights and hidden states moved between host and device, in bytes.",
        )
        self.expert_bytes_per_token = make(
            Gauge,
            "expert_offload_bytes_per_generated_token",
            "Expert offload: bytes moved per generated token, since start.",
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- EngineObserver (engine-loop thread) ---------------------------------------------------------------
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
        if tracker.scheduled_time is None:
            tracker.scheduled_time = now
            self.queue_time.observe(now - tracker.arrival_time)
        tracker.finish_reasons = [o.finish_reason for o in output.outputs]
        num_tokens = sum(len(o.token_ids) for o in output.outputs)
        if num_tokens > tracker.num_tokens:
            if tracker.last_token_time is None:
                tracker.first_token_time = now
                self.ttft.observe(now - tracker.arrival_time)
                self.prefill_time.observe(now - tracker.scheduled_time)
            else:
                self.itl.observe(now - tracker.last_token_time)
                self.tpot.observe((now - tracker.last_token_time) / (num_tokens - tracker.num_tokens))
            tracker.last_token_time, tracker.num_tokens = now, num_tokens
        if output.finished:
            del self._trackers[output.request_id]
            self._finished(output, tracker, now)

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

    def engine_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.prefix_hit_rate.set(stats.prefix_hit_rate)
        self.page_hit_rate.set(stats.page_hit_rate)
        if stats.state is not None:
            self.state_slots_used.set(stats.state.slots_used)
            self.state_slots_total.set(stats.state.slots_total)
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
        for _ in range(steps):  # one step per call in practice: its tokens are the batched-token delta
            self.iteration_tokens.observe((stats.num_batched_tokens - last.num_batched_tokens) / steps)
        self._expert_stats(stats, last)

    def _expert_stats(self, stats: EngineStats, last: EngineStats) -> None:
        if stats.experts is not None:
            self.experts_per_step.set(stats.experts.experts_touched_per_step)
            self.experts_per_block.set(stats.experts.experts_touched_per_block)
            self.expert_imbalance.set(stats.experts.load_imbalance)
        if stats.offload is not None:
            self.expert_hit_rate.set(stats.offload.hit_rate)
            self.expert_bytes.inc(stats.offload.bytes_moved - (last.offload or stats.offload).bytes_moved)
            self.expert_bytes_per_token.set(stats.expert_bytes_per_generated_token)


class _Bound:
    """A labelled metric with `model_name` already bound: `.labels(reason=...)` fills in the rest."""

    def __init__(self, metric: Counter, model_name: str) -> None:
        self._metric, self._model_name = metric, model_name

    def labels(self, **labels: str | None) -> Counter:
        return self._metric.labels(model_name=self._model_name, **labels)
