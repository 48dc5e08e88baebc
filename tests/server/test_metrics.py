"""/metrics as Prometheus and vLLM users expect: the `process_*` series, vLLM's per-request phase and per-step
series with consistent counts, `vllm:` names on request, and an aborted n=4 request counted four times."""

from __future__ import annotations

import re

import httpx

from diffuserve.engine.step_phases import PHASES
from diffuserve.server.metric_series import VLLM_SERIES
from diffuserve.server.metrics import ServerMetrics
from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer, sse_events

LONG = {
    "model": MODEL_NAME,
    "prompt": "Once upon 4",
    "max_tokens": 150,
    "ignore_eos": True,
    "decoder": "fixed",
    "steps": 4,
}


def _names(text: str) -> set[str]:
    """Metric names as declared (`# TYPE <name> <kind>`, counters without `_total`), labelled ones without
    samples too."""
    return {
        name.removesuffix("_total") if kind == "counter" else name
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M)
    }


def test_process_series_are_exported(live_server: LiveServer):
    text = httpx.get(f"{live_server.url}/metrics", timeout=30).text
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_gc_objects_collected_total",
        "python_info",
    ):
        assert re.search(rf"^{name}[{{ ]", text, re.M), name


def test_vllm_series_count_what_happened(live_server: LiveServer):
    names = (
        "request_prefill_time_seconds_count",
        "request_decode_time_seconds_count",
        "request_inference_time_seconds_count",
        "request_time_per_output_token_seconds_count",
        "request_params_n_count",
        "request_params_max_tokens_count",
        "e2e_request_latency_seconds_count",
    )
    before = {name: live_server.metric(name) for name in names}
    tpot_before = live_server.metric("time_per_output_token_seconds_count")
    itl_before = live_server.metric("inter_token_latency_seconds_count")
    response = live_server.client().completions.create(
        model=MODEL_NAME, prompt="count me", max_tokens=12, n=2, extra_body={"ignore_eos": True}
    )
    assert [c.finish_reason for c in response.choices] == ["length", "length"]
    for name in names:
        assert live_server.metric(name) == before[name] + 1, name
    assert live_server.metric("request_params_n_sum") >= 2
    # One time-per-output-token observation per committed block after the first, like inter-token latency.
    tpot = live_server.metric("time_per_output_token_seconds_count") - tpot_before
    assert tpot == live_server.metric("inter_token_latency_seconds_count") - itl_before and tpot >= 2
    # Every engine step is one iteration; their tokens add up to the batched tokens of the steps.
    assert live_server.metric("iteration_tokens_total_count") == live_server.metric("engine_steps_total")
    assert live_server.metric("iteration_tokens_total_sum") >= live_server.metric("generation_tokens_total")
    # Where the steps' time went (engine/step_phases.py): every phase counted, the forward's above zero.
    phases = {p: live_server.metric("engine_step_phase_seconds_total", phase=p) for p in PHASES}
    assert phases["forward"] > 0 and all(seconds >= 0 for seconds in phases.values())


def test_aborted_n4_request_counts_four_aborts(live_server: LiveServer):
    aborted = live_server.metric("request_success_total", finished_reason="abort")
    with httpx.stream(
        "POST",
        f"{live_server.url}/v1/completions",
        json={**LONG, "n": 4, "stream": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    ) as response:
        events = sse_events(response)
        assert next(events)["choices"]
    live_server.wait_for(lambda: live_server.metric("num_requests_running") == 0)
    live_server.wait_for(lambda: live_server.metric("request_success_total", finished_reason="abort") > aborted)
    assert live_server.metric("request_success_total", finished_reason="abort") == aborted + 4


def test_vllm_names_on_request():
    metrics = ServerMetrics("m", vllm_names=True)
    names = _names(metrics.render().decode())
    assert {f"vllm:{name}" for name in VLLM_SERIES} <= names
    assert "vllm:tokens_per_forward" not in names and "diffuserve:tokens_per_forward" in names
    assert not {n for n in _names(ServerMetrics("m").render().decode()) if n.startswith("vllm:")}
