"""Drives a diffuserve engine through a `bench sweep` workload in real time: each request is added at its arrival
time (continuous batching: it joins the running batch at the next step), or, as the engine's own static-batch
baseline, all of them together once the last has arrived. Records every step's wall time and the time inside the
model (bench/engine_run.ForwardProbe's hooks) and in each of the engine's phases (engine/step_phases.py), every
delivery of new tokens, and optionally a cProfile of the steps.

Knows nothing of peers or of the table.
"""

from __future__ import annotations

import cProfile
import io
import itertools
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from diffuserve.bench.engine_run import ForwardProbe
from diffuserve.bench.sweep_metrics import RequestTrace, StepTiming
from diffuserve.bench.sweep_workload import SweepRequest
from diffuserve.core.outputs import RequestOutput
from diffuserve.engine.gc_heap import frozen_heap
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.engine.step_phases import StepPhases
from diffuserve.sampling_params import SamplingParams

_ids = itertools.count()


@dataclass
class EngineRun:
    traces: list[RequestTrace]
    steps: list[StepTiming] = field(default_factory=list)
    wall_s: float = 0.0
    profile: list[str] | None = None
    """With profile=True: the top entries of the steps' cProfile, by own time."""
    phases: StepPhases = field(default_factory=StepPhases)
    """The engine's phases summed over the steps that ran a forward."""


def drive(
    engine: LLMEngine,
    requests: list[SweepRequest],
    params_for: Callable[[SweepRequest], SamplingParams],
    static: bool = False,
    profile: bool = False,
) -> EngineRun:
    """Runs `requests` to completion; `static`: admit them all at the last arrival (no request joins later)."""
    device = next(engine.runner.model.parameters()).device
    run = EngineRun([RequestTrace(r.arrival_s) for r in requests])
    last_arrival = max(r.arrival_s for r in requests)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    ids = {f"sweep-{next(_ids)}": i for i in range(len(requests))}
    id_of = {i: request_id for request_id, i in ids.items()}
    profiler = cProfile.Profile() if profile else None
    started, admitted, finished = time.perf_counter(), 0, 0
    with frozen_heap(), ForwardProbe(engine.runner.model, device) as probe:  # the served engine's GC (gc_heap.py)
        while finished < len(requests):
            now = time.perf_counter() - started
            due = last_arrival if static else now
            while admitted < len(order) and requests[order[admitted]].arrival_s <= due and now >= due:
                i = order[admitted]
                engine.add_request(id_of[i], requests[i].prompt, params_for(requests[i]))
                admitted += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, (due if static else requests[order[admitted]].arrival_s) - now))
                continue
            outputs = _timed_step(engine, probe, profiler, run)
            finished += _deliver(run.traces, ids, outputs, time.perf_counter() - started)
    run.wall_s = time.perf_counter() - started
    if profiler is not None:
        run.profile = top_entries(profiler)
    return run


def _timed_step(
    engine: LLMEngine, probe: ForwardProbe, profiler: cProfile.Profile | None, run: EngineRun
) -> list[RequestOutput]:
    """One engine step; its wall time, model time and phases are added to `run` when it ran a forward."""
    probe.reset()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    outputs = engine.step()
    if profiler is not None:
        profiler.disable()
    if probe.num_tokens:
        run.steps.append(StepTiming(time.perf_counter() - started, probe.model_s))
        run.phases += engine.last_step_phases
    return outputs


def _deliver(traces: list[RequestTrace], ids: dict[str, int], outputs: list[RequestOutput], at: float) -> int:
    """Notes the step's new tokens per request; returns how many requests finished."""
    finished = 0
    for out in outputs:
        trace = traces[ids[out.request_id]]
        trace.deliver(at, out.new_token_counts[0] if out.new_token_counts else 0)
        if out.finished:
            trace.tokens = list(out.outputs[0].token_ids)
            finished += 1
    return finished


def top_entries(profiler: cProfile.Profile, count: int = 15) -> list[str]:
    """The `count` functions with the most own time, one line each (calls, own s, cumulative s, where)."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            (own, f"{calls:>7} calls  {own:8.3f} s own  {cumulative:8.3f} s cum  {_short(path)}:{line}({name})")
        )
    return [text for _, text in sorted(rows, key=lambda r: -r[0])[:count]]


def _short(path: str) -> str:
    for marker in ("diffuserve/", "torch/", "site-packages/"):
        if marker in path:
            return path[path.index(marker) :]
    return path
