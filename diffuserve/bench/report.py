"""How benchmark results are shown: percentiles, a fixed-width human table, a progress line on stderr, and the
final single-line JSON that machines read (`diffuserve plan --calibrate` reads the last line of the output).
Knows nothing of what was measured.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """{"mean", "p50", "p90", "p99", "max"} of `values` x `scale` (None when there are no values)."""
    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "max": None}
    stats: dict[str, float | None] = {"mean": sum(values) / len(values) * scale}
    stats |= {f"p{q}": percentile(values, q) * scale for q in PERCENTILES}
    stats["max"] = max(values) * scale
    return stats


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Right-aligned columns; floats with 3 significant decimals."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"
        return "-" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def rounded(value: Any, digits: int = 6) -> Any:
    """Floats rounded to `digits` significant digits, recursively (keeps the JSON line readable)."""
    if isinstance(value, float):
        return value if not math.isfinite(value) or value == 0 else float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def emit_json(result: dict[str, Any], out_path: str | None = None) -> None:
    """Prints the result as the final single JSON line (and writes it to `out_path` if given)."""
    line = json.dumps(rounded(result), allow_nan=False, separators=(",", ":"))
    if out_path:
        Path(out_path).write_text(line + "\n")
    print(line, flush=True)


def finish(result: dict[str, Any], json_out: str | None, plot_dir: str | None) -> None:
    """Charts first (their paths go to stderr), then the JSON line, so that it is the last line of stdout."""
    if plot_dir:
        from diffuserve.bench.plot import write_plots

        for path in write_plots(result, plot_dir):
            print(f"wrote {path}", file=sys.stderr)
    emit_json(result, json_out)


class Progress:
    """A one-line progress indicator on stderr, redrawn at most every 0.5 s (silent when stderr is no TTY)."""

    def __init__(self, label: str, total: int, unit: str = "tokens") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.enabled = sys.stderr.isatty()
        self._last = 0.0
        self._start = time.perf_counter()
        self._done = 0

    def advance(self, count: int) -> None:
        self.update(self._done + count)

    def update(self, done: int) -> None:
        self._done = done
        now = time.perf_counter()
        if not self.enabled or (now - self._last < 0.5 and done < self.total):
            return
        self._last = now
        rate = done / (now - self._start) if now > self._start else 0.0
        sys.stderr.write(f"\r{self.label}: {done}/{self.total} {self.unit} ({rate:,.1f}/s)   ")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def variant_record(tokens: list[list[int]], nfe: int, walls: list[float]) -> dict[str, Any]:
    """tokens/s from the median wall time of the rounds (one round disturbed by another process moves it least)."""
    generated, seconds = sum(len(t) for t in tokens), statistics.median(walls)
    return {
        "generated_tokens": generated,
        "wall_s": seconds,
        "wall_s_repeats": walls,
        "tokens_per_s": generated / seconds,
        "nfe": nfe,
        "tpf": generated / nfe if nfe else 0.0,
        "forwards_per_s": nfe / seconds,
        "token_ids": tokens,
    }
