"""The engine's step phases (engine/step_phases.py) attribute each part of a step to its phase: a delay injected
into one phase's code shows in that phase and in no other, the phases never add up to more than the step's wall
time, and each step counts its scheduled requests. `bench sweep` sums these per row (tests/bench/test_sweep.py)."""

from __future__ import annotations

import time

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.engine.step_phases import PHASES, StepPhases

DELAY_S = 0.05
"""Far above what any phase of the tiny model's step takes on its own (a few milliseconds)."""

INJECTION_POINTS = {
    "schedule": ("scheduler", "schedule"),
    "batch": ("runner", "build_batch"),
    "forward": ("executor", "execute"),
    "decode": ("runner", "_decode_blocks"),
    "update": ("scheduler", "update_from_output"),
    "outputs": ("output_processor", "snapshot"),
}


def test_sums_and_per_request_step_figures():
    total = StepPhases(schedule=1.0, batch=2.0, num_request_steps=4)
    total += StepPhases(decode=3.0, outputs=1.0, num_request_steps=4)
    assert total.total == pytest.approx(7.0)
    expected = {"schedule": 1.0, "batch": 2.0, "forward": 0.0, "decode": 3.0, "update": 0.0, "outputs": 1.0}
    assert total.per_request_step_us() == pytest.approx({name: s / 8 * 1e6 for name, s in expected.items()})
    assert StepPhases().per_request_step_us()["batch"] == 0.0


@pytest.mark.parametrize("phase", PHASES)
def test_a_delay_shows_in_its_own_phase_only(tiny_model_dir, monkeypatch, phase):
    llm = LLM(str(tiny_model_dir), num_pages=64)
    engine = llm.engine
    owners = {
        "scheduler": engine.scheduler,
        "runner": engine.runner,
        "executor": engine.runner.executor,
        "output_processor": engine.output_processor,
    }
    owner_name, method = INJECTION_POINTS[phase]
    owner = owners[owner_name]
    original = getattr(owner, method)

    def delayed(*args, **kwargs):
        time.sleep(DELAY_S)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, method, delayed)
    for i in range(3):
        engine.add_request(f"r{i}", [5, 6, 7, 8, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    started = time.perf_counter()
    engine.step()
    wall = time.perf_counter() - started
    phases = engine.last_step_phases
    assert phases.num_request_steps == 3
    assert getattr(phases, phase) >= DELAY_S
    assert all(getattr(phases, other) < DELAY_S for other in PHASES if other != phase)
    assert 0.0 <= phases.total <= wall


def test_a_failed_step_leaves_no_phases_of_the_step_before(tiny_model_dir, monkeypatch):
    """A step that fails in the runner reports zeros, not the last good step's phases (bench sweep adds them)."""
    engine = LLM(str(tiny_model_dir), num_pages=64).engine
    engine.add_request("good", [5, 6, 7, 8, 9], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    assert engine.last_step_phases.num_request_steps == 1

    def fail(scheduled, beside=None):
        raise RuntimeError("injected forward fault")

    monkeypatch.setattr(engine.runner, "execute", fail)
    engine.step()
    assert engine.last_step_phases == StepPhases()
