"""The figures of one `bench sweep` row, from what a run recorded: per-request token deliveries, the step timings
of the engine, and the process's resident memory.

- tokens/s = every generated token / the run's wall time (from the first arrival to the last finish);
- TTFT = arrival -> the first delivery of a token to the request; ITL = the gap between two successive deliveries
  of new tokens to the same request (a diffusion block's tokens arrive together: one delivery);
- engine overhead = 1 - (time inside the model's forward and LM head) / (the step's wall time), over all steps
  that ran a forward (the same definition as `bench throughput`'s overhead %);
- peak memory = the process's resident-set high-water mark during the run minus its resident set before it
  (Linux: /proc/self/clear_refs resets the mark; tracemalloc cannot see torch's allocations). Elsewhere None.
Knows nothing of how the run was driven.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffuserve.bench.report import distribution


@dataclass
class RequestTrace:
    arrival_s: float
    deliveries: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the run's start, new tokens) for every delivery of new tokens."""
    tokens: list[int] = field(default_factory=list)
    """The request's final tokens."""

    def deliver(self, at: float, count: int) -> None:
        if count > 0:
            self.deliveries.append((at, count))

    def keep_first(self, count: int) -> None:
        """Only the first `count` tokens count (a static batch's row computed past its own end): the later ones
        and their deliveries are dropped, a delivery that crosses the cut keeps its part before it."""
        self.tokens = self.tokens[:count]
        kept, total = [], 0
        for at, n in self.deliveries:
            if total >= count:
                break
            kept.append((at, min(n, count - total)))
            total += n
        self.deliveries = kept

    @property
    def ttft(self) -> float | None:
        return self.deliveries[0][0] - self.arrival_s if self.deliveries else None

    @property
    def itls(self) -> list[float]:
        times = [t for t, _ in self.deliveries]
        return [b - a for a, b in zip(times, times[1:])]


@dataclass(frozen=True)
class StepTiming:
    wall_s: float
    """engine.step() from call to return."""
    model_s: float
    """Inside the model's forward and LM head during that step."""


def overhead_fraction(steps: Sequence[StepTiming]) -> float | None:
    """1 - model time / step time, summed over the steps (None when no step ran)."""
    wall = sum(s.wall_s for s in steps)
    return 1 - sum(s.model_s for s in steps) / wall if wall else None


def row_figures(traces: Sequence[RequestTrace], wall_s: float) -> dict[str, Any]:
    """tokens/s, TTFT and ITL distributions (seconds) of one run."""
    generated = sum(len(t.tokens) for t in traces)
    ttfts = [t.ttft for t in traces if t.ttft is not None]
    return {
        "num_requests": len(traces),
        "generated_tokens": generated,
        "wall_s": wall_s,
        "tokens_per_s": generated / wall_s if wall_s else 0.0,
        "ttft_s": distribution(ttfts),
        "itl_s": distribution([gap for t in traces for gap in t.itls]),
    }


def static_batch_ceiling(traces: Sequence[RequestTrace], block_length: int) -> float:
    """What a perfect continuous batcher could gain over a static batch on these requests if a block cost the same
    whatever else is batched: a static batch computes every row for as many blocks as its longest request, a
    continuous batcher each request's own blocks (at least one). Counted in blocks, not tokens: a request's last
    block is decoded whole (a renoise canvas always; a threshold decode until its positions before the request's
    end are decided, which on random weights is most of the block's steps)."""
    blocks = [max(1, -(-len(t.tokens) // block_length)) for t in traces]
    return len(blocks) * max(blocks) / sum(blocks)


def _status_kib(field_name: str) -> int | None:
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return None


class PeakRss:
    """The resident-set growth of this process over a `with` block, in bytes (`peak_bytes`; None off Linux)."""

    method = "rss-hwm-delta"

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self._before: int | None = None

    def __enter__(self) -> PeakRss:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS
        except OSError:
            return self
        self._before = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _status_kib("VmHWM")
        if self._before is not None and peak is not None:
            self.peak_bytes = max(0, peak - self._before) * 1024
