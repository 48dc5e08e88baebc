"""Which Prometheus series a server exports: names (vLLM's, with a `diffuserve:` prefix, plus the
block-diffusion ones), help texts, labels and buckets, in one registry per server (with prometheus_client's
`process_*`, `python_*` and GC collectors), so several servers can live in one process. Every metric is labelled
`model_name`.

With `vllm_names`, the series vLLM also exports are named `vllm:...` instead of `diffuserve:...`, so that
dashboards made for vLLM work unchanged; the diffusion-only ones keep their `diffuserve:` names. How engine
events move the series is `metrics.py`'s business.
"""

from __future__ import annotations

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
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
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
        "cache_config_info",
    }
)
"""The series vLLM exports under the same name and meaning (`--metrics-vllm-names` renames them `vllm:...`)."""
N_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)

disable_created_metrics()  # no `*_created` series next to every counter (vLLM does the same)


class MetricSeries:
    """Every series of one server, in its own registry; `ServerMetrics` updates them."""

    def __init__(self, model_name: str, vllm_names: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.vllm_names = vllm_names
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)

        def make(kind: type, name: str, doc: str, labels: tuple[str, ...] = (), **kwargs: object) -> Any:
            metric = kind(self.series_name(name), doc, ("model_name", *labels), registry=self.registry, **kwargs)
            return metric.labels(model_name=model_name) if not labels else _Bound(metric, model_name)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled (incl. preempted).")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV-cache pages in use (1 = 100 %).")
        self.kv_pages_used = make(Gauge, "kv_cache_pages_used", "KV-cache pages in use (held by requests).")
        self.kv_pages_total = make(Gauge, "kv_cache_pages_total", "KV-cache pages in the pool.")
        self.cache_config = make(
            Gauge,
            "cache_config_info",
            "KV-cache settings as labels (value 1): block_size is the page size in tokens.",
            ("block_size", "num_gpu_blocks", "cache_dtype"),
        )
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
        self.step_phase_seconds = make(
            Counter,
            "engine_step_phase_seconds",
            "Wall seconds of the engine's steps by phase: schedule, batch, forward, decode, update, outputs.",
            ("phase",),
        )
        self.rejected = make(Counter, "requests_rejected", "Requests refused before reaching the engine.", ("reason",))
        self.success = make(Counter, "request_success", "Finished completions.", ("finished_reason",))
        self._add_latency_metrics(make)
        self._add_phase_metrics(make)
        self._add_size_metrics(make)
        self._add_expert_metrics(make)
        self._add_state_metrics(make)
        self._add_spec_decode_metrics(make)

    def _add_state_metrics(self, make: Any) -> None:
        """Hybrid models' recurrent-state pool (set only for models with GDN layers)."""
        self.state_slots_used = make(Gauge, "state_slots_used", "Recurrent-state slots held by running requests.")
        self.state_slots_total = make(Gauge, "state_slots_total", "Recurrent-state slots in the pool.")
        self.state_usage = make(
            Gauge, "state_slot_usage_perc", "Fraction of recurrent-state slots held by running requests (1 = 100 %)."
        )
        self.state_snapshots = make(Gauge, "state_prefix_snapshots", "Slots holding a prefix-cache state snapshot.")
        self.state_hit_rate = make(
            Gauge,
            "prefix_cache_state_hit_rate",
            "Prompt tokens restored from a state snapshot (with their pages) / prompt tokens looked up, since start.",
        )

    def _add_spec_decode_metrics(self, make: Any) -> None:
        """Verified decoding (decoder=verified), under vLLM's speculative-decoding names."""
        self.spec_drafts = make(Counter, "spec_decode_num_drafts", "Drafted blocks verified by a commit forward.")
        self.spec_draft_tokens = make(
            Counter, "spec_decode_num_draft_tokens", "Drafted tokens checked against the causal path."
        )
        self.spec_accepted_tokens = make(
            Counter, "spec_decode_num_accepted_tokens", "Drafted tokens the causal path kept."
        )
        self.spec_acceptance_length = make(
            Gauge,
            "spec_decode_mean_acceptance_length",
            "Tokens a verified block yields (kept drafts + the causal token at a rejection) per block, since start.",
        )
        self.auto_steps = make(
            Counter,
            "auto_decoding_steps",
            "Steps with decoder=auto requests, by what they did: drafted (verified) or decided their next token only "
            "(autoregressive), as --auto-draft-tokens chose.",
            ("mode",),
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

    def _add_latency_metrics(self, make: Any) -> None:
        """Per-request latencies in block-diffusion terms (see the module docstring)."""
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

    def _add_size_metrics(self, make: Any) -> None:
        """Per-request sizes, NFE and TPF."""
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

    def series_name(self, name: str) -> str:
        """`name` with the prefix this server exports it under (`vllm:` for vLLM's series with vllm_names)."""
        return (VLLM_PREFIX if self.vllm_names and name in VLLM_SERIES else PREFIX) + name

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Bound:
    """A labelled metric with `model_name` already bound: `.labels(reason=...)` fills in the rest."""

    def __init__(self, metric: Counter, model_name: str) -> None:
        self._metric, self._model_name = metric, model_name

    def labels(self, **labels: str | None) -> Counter:
        return self._metric.labels(model_name=self._model_name, **labels)
