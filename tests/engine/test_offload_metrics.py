"""Expert statistics and expert-offload accounting reach EngineStats and the Prometheus /metrics text."""

from __future__ import annotations

from diffuserve import LLM, SamplingParams
from diffuserve.server.metrics import ServerMetrics


def _value(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f"diffuserve:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_offload_and_routing_metrics_are_exported(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=128, expert_offload=True, expert_stats=True)
    metrics = ServerMetrics("tiny")
    metrics.engine_stats(llm.engine.stats())  # the server's start: counters count from here
    llm.generate({"prompt_token_ids": [5, 9, 14, 3, 8]}, SamplingParams(max_tokens=12, ignore_eos=True))
    stats = llm.engine.stats()
    metrics.engine_stats(stats)
    text = metrics.render().decode()
    assert _value(text, "expert_cache_hit_rate") == stats.offload.hit_rate > 0
    assert _value(text, "expert_offload_bytes_total") == stats.offload.bytes_moved > 0
    assert _value(text, "expert_offload_bytes_per_generated_token") == stats.expert_bytes_per_generated_token
    assert _value(text, "experts_touched_per_step") == stats.experts.experts_touched_per_step > 0
    assert _value(text, "expert_load_imbalance") >= 1.0
