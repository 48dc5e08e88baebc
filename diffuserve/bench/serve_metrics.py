"""Serving metrics from what a streaming client observed, per request and per sweep point. Pure functions.

Definitions (vLLM `bench serve` / GenAI-Perf conventions; docs/benchmarks/index.md repeats them):
- TTFT: request sent -> first chunk with non-empty content.
- E2E: request sent -> stream finished.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request.
- ITL per chunk: the gap between consecutive content chunks. A block-diffusion server sends a whole committed
  block as one chunk, so these gaps are long and few.
- ITL per token: each gap divided by the tokens in the chunk that ended it, counted once per token (what an AR
  server's per-token ITL would be for the same stream). Chunk token counts come from the server's running
  usage (`continuous_usage_stats`) when it reports one, else the request's total tokens split in proportion
  to each chunk's characters (marked "estimated").
- output tokens/s = all output tokens / duration (first request sent -> last finished); goodput = requests
  that met every latency target / duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from diffuserve.bench.report import distribution

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass
class RequestTrace:
    """What the client saw of one request (times in seconds on one monotonic clock)."""

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    """Arrival of each chunk with non-empty content."""
    chunk_chars: list[int] = field(default_factory=list)
    chunk_usage_tokens: list[int | None] = field(default_factory=list)
    """Cumulative completion tokens reported with each content chunk (None when the server sent none)."""
    done_at: float | None = None
    output_tokens: int | None = None
    """From the final usage; None if the server reported none."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens the server served from its prefix cache (usage.prompt_tokens_details), if it said."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_at is not None and bool(self.chunk_times)

    @property
    def num_output_tokens(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        known = [u for u in self.chunk_usage_tokens if u is not None]
        return known[-1] if known else len(self.chunk_times)

    @property
    def tokens_exact(self) -> bool:
        return bool(self.chunk_usage_tokens) and all(u is not None for u in self.chunk_usage_tokens)

    def chunk_tokens(self) -> list[float]:
        """Tokens in each content chunk: running-usage deltas, else characters pro rata."""
        if self.tokens_exact:
            counts = [float(u) for u in self.chunk_usage_tokens if u is not None]  # all are, see tokens_exact
            return [counts[0]] + [b - a for a, b in zip(counts, counts[1:])]
        chars = sum(self.chunk_chars) or 1
        return [self.num_output_tokens * c / chars for c in self.chunk_chars]

    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent_at

    def e2e(self) -> float:
        return (self.done_at or self.sent_at) - self.sent_at

    def tpot(self) -> float | None:
        n = self.num_output_tokens
        return (self.e2e() - self.ttft()) / (n - 1) if n > 1 else None

    def itl_chunks(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def itl_tokens(self) -> list[float]:
        """One value per token after the first chunk: its chunk's gap / the chunk's tokens."""
        values = []
        for gap, tokens in zip(self.itl_chunks(), self.chunk_tokens()[1:]):
            whole = max(1, round(tokens))
            values += [gap / whole] * whole
        return values


def parse_slos(specs: Sequence[str]) -> dict[str, float]:
    """["ttft:300", "tpot:50"] -> {"ttft": 0.3, "tpot": 0.05} (milliseconds in, seconds out)."""
    slos = {}
    for spec in specs:
        name, _, value = spec.partition(":")
        if name not in SLO_METRICS or not value:
            raise ValueError(f"goodput: {spec!r} is not METRIC:MS with METRIC one of {', '.join(SLO_METRICS)}")
        try:
            slos[name] = float(value) / 1000
        except ValueError:
            raise ValueError(f"goodput: {spec!r}: {value!r} is not a number of milliseconds") from None
        if slos[name] <= 0:
            raise ValueError(f"goodput: {spec!r}: the target must be > 0 ms")
    return slos


def meets_slos(trace: RequestTrace, slos: dict[str, float]) -> bool:
    """Every given target met; ITL means the request's largest per-token ITL."""
    observed = {
        "ttft": trace.ttft(),
        "tpot": trace.tpot() or 0.0,
        "e2e": trace.e2e(),
        "itl": max(trace.itl_tokens(), default=0.0),
    }
    return all(observed[name] <= limit for name, limit in slos.items())


def prefix_hit_rate(traces: Sequence[RequestTrace]) -> float | None:
    """Cached prompt tokens / prompt tokens over `traces` (None if the server reported no cached tokens)."""
    if not traces or any(t.cached_tokens is None for t in traces):
        return None
    prompt = sum(t.prompt_tokens or 0 for t in traces)
    return sum(t.cached_tokens or 0 for t in traces) / prompt if prompt else 0.0


def summarize(traces: Sequence[RequestTrace], slos: dict[str, float]) -> dict[str, Any]:
    """The sweep point's figures over all its requests (failed ones count as errors, never as latencies)."""
    ok = [t for t in traces if t.ok]
    start = min((t.sent_at for t in traces), default=0.0)
    end = max((t.done_at or t.sent_at for t in traces), default=0.0)
    duration = end - start
    output_tokens = sum(t.num_output_tokens for t in ok)
    prompt_tokens = sum(t.prompt_tokens or 0 for t in ok)
    good = sum(meets_slos(t, slos) for t in ok)
    chunks = sum(len(t.chunk_times) for t in ok)
    return {
        "num_requests": len(traces),
        "completed": len(ok),
        "errors": len(traces) - len(ok),
        "error_examples": sorted({t.error for t in traces if t.error})[:3],
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "output_tokens_per_s": output_tokens / duration if duration else 0.0,
        "total_tokens_per_s": (output_tokens + prompt_tokens) / duration if duration else 0.0,
        "goodput_requests_per_s": good / duration if duration else 0.0,
        "goodput_fraction": good / len(traces) if traces else 0.0,
        "ttft_s": distribution([t.ttft() for t in ok]),
        "tpot_s": distribution([v for t in ok if (v := t.tpot()) is not None]),
        "itl_chunk_s": distribution([g for t in ok for g in t.itl_chunks()]),
        "itl_token_s": distribution([g for t in ok for g in t.itl_tokens()]),
        "e2e_s": distribution([t.e2e() for t in ok]),
        "tokens_per_chunk": output_tokens / chunks if chunks else 0.0,
        "chunk_token_counts": "usage" if ok and all(t.tokens_exact for t in ok) else "estimated",
        "prefix_hit_rate": prefix_hit_rate(ok),
    }
