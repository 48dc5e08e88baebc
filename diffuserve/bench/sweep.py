"""`diffuserve bench sweep`: the engine against its family's strongest batched peer (bench/sweep_readings.py) at
several concurrencies and two workloads (bench/sweep_workload.py), one run per row, side by side.

Per row: tokens/s of both, their ratio (engine / peer), TTFT and ITL p50 / p99 of both, peak memory of both (the
process's resident-set growth during the run, bench/sweep_metrics.py), the engine's overhead (share of the step
outside the model's forward) and where its time goes, phase by phase, per request-step (engine/step_phases.py),
and, on the best case (equal prompts, no stops, where the peer decodes exactly what
the engine does), whether their tokens are equal. The engine receives each request at its arrival (continuous
batching); a static peer starts once the last request has arrived. A fresh engine per row, warmed up before it is
timed; the peer is warmed up once per reading. Targets: on the realistic workload the engine >= 1.5x the
peer at 16 concurrent and >= 2x at 64 and 128; >= 1.0x on the best case; overhead < 10 % at 128. --profile adds a
cProfile of the engine's steps on the realistic workload at the largest concurrency. Knows nothing of CLI parsing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diffuserve.bench.context import BenchContext, make_context
from diffuserve.bench.report import finish, format_table
from diffuserve.bench.sweep_engine import drive
from diffuserve.bench.sweep_metrics import PeakRss, overhead_fraction, row_figures, static_batch_ceiling
from diffuserve.bench.sweep_peers import Peer
from diffuserve.bench.sweep_readings import Reading, family_name, fresh_engine, readings, request_params
from diffuserve.bench.sweep_workload import SweepRequest, make_workload
from diffuserve.engine.gc_heap import frozen_heap
from diffuserve.engine.step_phases import PHASES

RATIO_TARGETS = {("realistic", 16): 1.5, ("realistic", 64): 2.0, ("realistic", 128): 2.0}
BEST_CASE_TARGET = 1.0
OVERHEAD_TARGET = (128, 0.10)
"""(concurrency, the most engine overhead allowed there)."""


def workload(ctx: BenchContext, ns: argparse.Namespace, kind: str, concurrency: int) -> list[SweepRequest]:
    special = {ctx.args.mask_token_id, *ctx.args.eos_token_ids}
    if ctx.args.pad_token_id is not None:
        special.add(ctx.args.pad_token_id)
    allowed = [t for t in range(ctx.args.vocab_size) if t not in special]
    return make_workload(kind, concurrency, ns.prompt_tokens, ns.output_tokens, allowed, ns.seed, ns.arrival_window)


def measure_row(
    ctx: BenchContext, ns: argparse.Namespace, reading: Reading, peer: Peer, kind: str, concurrency: int
) -> dict[str, Any]:
    requests = workload(ctx, ns, kind, concurrency)
    label = f"{reading.name}, {kind}, {concurrency} concurrent"
    print(f"sweep: {label}: engine", file=sys.stderr, flush=True)
    with PeakRss() as engine_memory:  # the engine's K/V pages are allocated when it is built: measured with it
        engine = fresh_engine(ctx, ns, reading.block_length, concurrency)
        run = drive(engine, requests, request_params(ns))
    engine.shutdown()
    print(f"sweep: {label}: {peer.name}", file=sys.stderr, flush=True)
    with PeakRss() as peer_memory, frozen_heap():  # the peer's heap as the engine's (engine/gc_heap.py)
        peer_run = peer.run(requests)
    engine_row = row_figures(run.traces, run.wall_s) | {
        "peak_memory_bytes": engine_memory.peak_bytes,
        "overhead_fraction": overhead_fraction(run.steps),
        "num_steps": len(run.steps),
        "phases_us_per_request_step": run.phases.per_request_step_us(),
    }
    peer_row = row_figures(peer_run.traces, peer_run.wall_s) | {"peak_memory_bytes": peer_memory.peak_bytes}
    engine_tokens, peer_tokens = [t.tokens for t in run.traces], [t.tokens for t in peer_run.traces]
    return {
        "reading": reading.name,
        "block_length": reading.block_length,
        "workload": kind,
        "concurrency": concurrency,
        "peer": peer.name,
        "engine": engine_row,
        "peer_result": peer_row,
        "ratio": engine_row["tokens_per_s"] / peer_row["tokens_per_s"] if peer_row["tokens_per_s"] else None,
        "same_tokens": engine_tokens == peer_tokens if kind == "best-case" and reading.exact else None,
        "token_agreement": agreement(engine_tokens, peer_tokens),
        "static_batch_ceiling": static_batch_ceiling(run.traces, reading.block_length),
    }


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """The share of output positions where both runs have the same token."""
    total = sum(max(len(x), len(y)) for x, y in zip(a, b, strict=True))
    same = sum(p == q for x, y in zip(a, b) for p, q in zip(x, y))
    return same / total if total else 1.0


def profile(ctx: BenchContext, ns: argparse.Namespace, reading: Reading) -> list[str]:
    """The engine's steps under cProfile on the realistic workload at the largest concurrency (not a timed row)."""
    concurrency = max(ns.concurrency)
    engine = fresh_engine(ctx, ns, reading.block_length, concurrency)
    run = drive(engine, workload(ctx, ns, "realistic", concurrency), request_params(ns), profile=True)
    engine.shutdown()
    return run.profile or []


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    met = []
    for row in rows:
        key = (row["workload"], row["concurrency"])
        minimum = BEST_CASE_TARGET if row["workload"] == "best-case" else RATIO_TARGETS.get(key)
        if minimum is not None and row["ratio"] is not None:
            met.append({**_key(row), "what": "ratio", "value": row["ratio"], "target": f">= {minimum}"})
            met[-1]["met"] = row["ratio"] >= minimum
        overhead = row["engine"]["overhead_fraction"]
        if row["concurrency"] == OVERHEAD_TARGET[0] and overhead is not None:
            met.append({**_key(row), "what": "overhead", "value": overhead, "target": f"< {OVERHEAD_TARGET[1]}"})
            met[-1]["met"] = overhead < OVERHEAD_TARGET[1]
    return met


def _key(row: dict[str, Any]) -> dict[str, Any]:
    return {"reading": row["reading"], "workload": row["workload"], "concurrency": row["concurrency"]}


def table(rows: list[dict[str, Any]]) -> str:
    headers = ["reading", "workload", "conc", "peer", "engine tok/s", "peer tok/s", "ratio"]
    headers += ["TTFT p50/p99 s eng", "peer", "ITL p50/p99 s eng", "peer", "mem MiB eng", "peer", "ovh %", "same"]
    lines = []
    for r in rows:
        e, p = r["engine"], r["peer_result"]
        same = "-" if r["same_tokens"] is None else str(r["same_tokens"])
        lines.append(
            [
                r["reading"],
                r["workload"],
                r["concurrency"],
                r["peer"],
                e["tokens_per_s"],
                p["tokens_per_s"],
                r["ratio"],
                _pair(e["ttft_s"]),
                _pair(p["ttft_s"]),
                _pair(e["itl_s"]),
                _pair(p["itl_s"]),
                _mib(e["peak_memory_bytes"]),
                _mib(p["peak_memory_bytes"]),
                100 * (e["overhead_fraction"] or 0.0),
                same,
            ]
        )
    return format_table(headers, lines)


def phase_table(rows: list[dict[str, Any]]) -> str:
    """The engine's phases (engine/step_phases.py) in microseconds per request-step, row by row."""
    headers = ["reading", "workload", "conc", *(f"{name} us" for name in PHASES), "all but forward us"]
    lines = []
    for r in rows:
        phases = r["engine"]["phases_us_per_request_step"]
        outside = sum(value for name, value in phases.items() if name != "forward")
        lines.append([r["reading"], r["workload"], r["concurrency"], *(phases[name] for name in PHASES), outside])
    return format_table(headers, lines)


def _pair(stats: dict[str, float | None]) -> str:
    return "-" if stats["p50"] is None else f"{stats['p50']:.3g}/{stats['p99']:.3g}"


def _mib(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def chosen_readings(ctx: BenchContext, ns: argparse.Namespace) -> list[Reading]:
    """The family's readings that --readings names (all by default); naming one the family lacks is an error."""
    available = readings(ctx, ns)
    names = [r.name for r in available]
    missing = [name for name in ns.readings or [] if name not in names]
    if missing:
        raise ValueError(
            f"readings: the {family_name(ctx)} family has no {' or '.join(missing)} reading; it has {', '.join(names)}"
        )
    return [r for r in available if not ns.readings or r.name in ns.readings]


def run(ns: argparse.Namespace) -> int:
    ctx = make_context(ns)
    rows, profiles = [], {}
    for reading in chosen_readings(ctx, ns):
        peer = reading.make_peer()
        peer.run(workload(ctx, ns, "best-case", 2))  # warm-up, not timed
        rows += [measure_row(ctx, ns, reading, peer, kind, c) for kind in ns.workload for c in ns.concurrency]
        if ns.profile:
            profiles[reading.name] = profile(ctx, ns, reading)
            print(f"sweep: {reading.name}: engine step profile, top by own time", file=sys.stderr)
            print("\n".join(profiles[reading.name]), file=sys.stderr, flush=True)
    print(table(rows))
    print("engine step phases, microseconds per request-step (engine/step_phases.py):")
    print(phase_table(rows))
    met = targets(rows)
    for t in met:
        verdict = "met" if t["met"] else "NOT met"
        where = f"{t['reading']} {t['workload']} x{t['concurrency']}"
        print(f"{where}: {t['what']} {t['value']:.3g} ({t['target']}): {verdict}")
    workload_json = {
        "family": family_name(ctx),
        "prompt_tokens": ns.prompt_tokens,
        "output_tokens": ns.output_tokens,
        "concurrency": ns.concurrency,
        "workloads": ns.workload,
        "arrival_window_s": ns.arrival_window,
        "denoising_steps": ns.denoising_steps,
        "max_prefill_tokens": ns.max_prefill_tokens,
        "temperature": 0.0,
        "seed": ns.seed,
        "peak_memory_method": PeakRss.method,
    }
    record = {**ctx.run_record("sweep"), "workload": workload_json, "results": rows, "targets": met}
    finish(record | {"profiles": profiles}, ns.json_out, None)
    return 0
