"""The engine's step phases at 128 concurrent requests, before and now (docs/benchmarks/throughput.md): per family,
reading and workload, a run of the same `bench sweep` rows at 128 only on today's code (results sweep-128-<family>)
beside one on the main table's code (the tiny shapes: sweep-128-<family>-05cc80c, run just before it in the same
session; the bench shapes: the main table's own run, sweep-<family>), with the engine's targets there."""

from __future__ import annotations

from typing import Any

from scripts.doc_tables.benchmarks_sweep import PHASE_NAMES
from scripts.doc_tables.cells import Load, table

RECORDED = ("sdar", "llada2", "clover", "diffusiongemma", "sdar-bench", "llada2-bench", "clover-bench")
"""The families with a sweep-128-<family> run, in the main table's order (tiny shapes, then bench shapes)."""
ENGINE_US_TARGET = 15.0
"""Engine time (every phase but the forward) per request-step at 128 concurrent, on every tiny shape."""
OVERHEAD_TARGETS = {"tiny": 0.15, "bench": 0.05}
BEFORE_COMMIT = "05cc80c"
"""The code of the main table's runs."""


def _before(family: str) -> str:
    """The results name of the family's run on the main table's code."""
    return f"sweep-{family}" if family.endswith("-bench") else f"sweep-128-{family}-{BEFORE_COMMIT}"


"""Time outside the model's forward, as a share of the wall time, at 128 concurrent."""


def _engine_us(phases: dict[str, float]) -> float:
    return sum(phases[name] for name in PHASE_NAMES if name != "forward")


def _mark(text: str, met: bool) -> str:
    return f"{text} ({'met' if met else '**not met**'})"


def _rows(family: str, load: Load) -> list[list[str]]:
    before, now = load(_before(family)), load(f"sweep-128-{family}")
    old_rows = {(r["reading"], r["workload"]): r for r in before["result"]["results"] if r["concurrency"] == 128}
    shape = "bench" if family.endswith("-bench") else "tiny"
    rows = []
    for row in now["result"]["results"]:
        old = old_rows.get((row["reading"], row["workload"]))
        if old is None or row["concurrency"] != 128:
            continue
        was, new = old["engine"]["phases_us_per_request_step"], row["engine"]["phases_us_per_request_step"]
        engine = f"{_engine_us(was):.1f} → {_engine_us(new):.1f}"
        share_was, share = old["engine"]["overhead_fraction"], row["engine"]["overhead_fraction"]
        overhead = f"{100 * share_was:.1f} % → {100 * share:.1f} %"
        rows.append(
            [
                f"{now['result']['model']['name']}: {row['reading']}",
                row["workload"],
                _mark(engine, _engine_us(new) <= ENGINE_US_TARGET) if shape == "tiny" else engine,
                _mark(overhead, share < OVERHEAD_TARGETS[shape]),
                *(f"{was[name]:.1f} → {new[name]:.1f}" for name in PHASE_NAMES),
                f"{before['git']} → {now['git']}",
            ]
        )
    return rows


def phases_change(load: Load) -> str:
    """Every recorded family's rows: engine time and overhead against their targets, then each phase."""
    rows: list[list[Any]] = [cells for family in RECORDED for cells in _rows(family, load)]
    headers = [
        "model: reading",
        "workload",
        f"engine µs: all but the forward (target ≤ {ENGINE_US_TARGET:.0f} on tiny shapes)",
        "overhead (target < 15 % tiny, < 5 % bench)",
        *(f"{name} µs" for name in PHASE_NAMES),
        "git",
    ]
    return table(headers, rows)
