"""Where an engine step's wall time goes, phase by phase, measured with `time.perf_counter` stamps (no profiler,
whose per-call cost would inflate the Python phases against the model's):

    schedule   Scheduler.schedule: plans each request's work and allocates its pages
    batch      ModelRunner.build_batch: the flattened batch, each cache kind's metadata
    forward    the executor's forward (the model), with the rows carried from earlier steps
    decode     the LM head over the read rows and every decoder, prompt scores and verifications
    update     Scheduler.update_from_output and releasing what finished requests held
    outputs    detokenization, stop strings and the step's RequestOutputs

`LLMEngine.step` fills one `StepPhases` per step (`LLMEngine.last_step_phases`); the runner times its own three
(batch, forward, decode) and hands them back in `StepResult.phase_seconds` (a runner that does not, a benchmark
baseline's, counts whole as the forward), and adds them to its counters (`EngineStats.phases`, exported as
`diffuserve:engine_step_phase_seconds{phase}`). `bench sweep` sums them over a run and reports each phase in
microseconds per request-step: the engine's per-request cost, which is what grows with the batch.

Knows nothing of what runs in each phase.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PHASES = ("schedule", "batch", "forward", "decode", "update", "outputs")


@dataclass
class StepPhases:
    """Wall seconds of each phase (`PHASES`) over one step or a sum of steps, and the request-steps they served
    (the scheduled requests of each step, summed)."""

    schedule: float = 0.0
    batch: float = 0.0
    forward: float = 0.0
    decode: float = 0.0
    update: float = 0.0
    outputs: float = 0.0
    num_request_steps: int = 0

    def __iadd__(self, other: StepPhases) -> StepPhases:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in PHASES)

    def per_request_step_us(self) -> dict[str, float]:
        """Each phase's microseconds per request-step (0 for no steps)."""
        count = max(self.num_request_steps, 1)
        return {name: getattr(self, name) / count * 1e6 for name in PHASES}
