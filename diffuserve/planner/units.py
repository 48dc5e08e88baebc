"""Units and number formatting for the planner's reports.

Owns the binary/decimal unit constants and the short human spellings ("80.0 KiB", "12.1 ms", "34.86B").
Knows nothing of models, hardware or formulas.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TERA = 1e12


def fmt_bytes(num_bytes: float) -> str:
    """Binary units, 3 significant digits: 81920 -> '80.0 KiB'."""
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.1f} {unit}" if num_bytes / size >= 100 else f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def fmt_count(count: float) -> str:
    """Parameter-style counts: 34_860_000_000 -> '34.86B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.2f}{unit}"
    return f"{count:.0f}"


def fmt_time(seconds: float) -> str:
    """'35.0 µs', '12.1 ms', '1.52 s', '2.0 h'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_rate(bytes_per_s: float) -> str:
    """Decimal bandwidth, as vendors quote it: 4.8e12 -> '4.80 TB/s'."""
    for unit, size in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.2f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def fmt_flops(flops: float, per_second: bool = False) -> str:
    """'989 TFLOP/s', '1.23 GFLOP'."""
    suffix = "FLOP/s" if per_second else "FLOP"
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if flops >= size:
            return f"{flops / size:.3g} {unit}{suffix}"
    return f"{flops:.0f} {suffix}"


def fmt_money(dollars: float) -> str:
    """'$0.321', '$1.17', '$35,000'."""
    if abs(dollars) >= 1000:
        return f"${dollars:,.0f}"
    if abs(dollars) >= 1:
        return f"${dollars:.2f}"
    return f"${dollars:.3g}"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple
