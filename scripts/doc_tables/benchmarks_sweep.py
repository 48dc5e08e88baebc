"""The `bench sweep` table of docs/benchmarks.md (issue 36): per family, the engine against its batched peer at each
concurrency and workload, with the command that produced it (results sweep-<family>)."""

from __future__ import annotations

from typing import Any

from scripts.doc_tables.cells import Load, ms, sig3, table

FAMILIES = ("sdar", "llada2", "clover", "diffusiongemma", "sdar-bench", "clover-bench")
"""The results files sweep-<name>, in the order the tables show them (sdar-bench, clover-bench: the bench shapes,
16 and 64 concurrent)."""
HEADERS = [
    "reading: peer",
    "workload",
    "conc.",
    "engine tok/s",
    "peer tok/s",
    "engine / peer",
    "TTFT p50 / p99 ms: engine",
    "peer",
    "ITL p50 / p99 ms: engine",
    "peer",
    "peak MiB: engine",
    "peer",
    "engine overhead",
    "same tokens",
]


def _pair(stats: dict[str, float | None]) -> str:
    p50, p99 = stats["p50"], stats["p99"]
    return "–" if p50 is None or p99 is None else f"{ms(p50, 0)} / {ms(p99, 0)}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:.1f}"


def _verdict(text: str, row: dict[str, Any], targets: list[dict[str, Any]], what: str) -> str:
    """`text`, followed by the verdict of the row's target on `what` (ratio, overhead) where it has one."""
    for t in targets:
        key = (t["reading"], t["workload"], t["concurrency"], t["what"])
        if key == (row["reading"], row["workload"], row["concurrency"], what):
            return f"{text} ({'met' if t['met'] else '**not met**'}: {t['target']})"
    return text


def _row(row: dict[str, Any], targets: list[dict[str, Any]]) -> list[str]:
    e, p = row["engine"], row["peer_result"]
    same = "–" if row["same_tokens"] is None else ("yes" if row["same_tokens"] else "no")
    return [
        f"{row['reading']}: {row['peer']}",
        row["workload"],
        str(row["concurrency"]),
        sig3(e["tokens_per_s"]),
        sig3(p["tokens_per_s"]),
        _verdict(f"{row['ratio']:.2f}x", row, targets, "ratio"),
        _pair(e["ttft_s"]),
        _pair(p["ttft_s"]),
        _pair(e["itl_s"]),
        _pair(p["itl_s"]),
        _mib(e["peak_memory_bytes"]),
        _mib(p["peak_memory_bytes"]),
        _verdict(f"{100 * e['overhead_fraction']:.0f} %", row, targets, "overhead"),
        same,
    ]


def sweep(load: Load) -> str:
    parts = []
    for family in FAMILIES:
        data = load(f"sweep-{family}")
        result = data["result"]
        model = result["model"]["name"]
        rows = [_row(r, result["targets"]) for r in result["results"]]
        parts.append(f"**{result['workload']['family']}** ({model}): `{data['command']}`\n\n{table(HEADERS, rows)}")
    return "\n\n".join(parts)
