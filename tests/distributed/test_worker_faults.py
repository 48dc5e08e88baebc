"""A worker rank that fails (raises while starting, raises mid-run, or dies without a word) fails the engine with
the worker's own error, promptly: the engine never hangs on a collective whose peer is gone. Faults are injected by
handing the spawned workers another target (a module-level function, so that it pickles into the worker)."""

from __future__ import annotations

import os
import re
import time

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.engine import engine_setup
from diffuserve.errors import GenerationFailed

PARAMS = SamplingParams(max_tokens=16, ignore_eos=True, threshold=0.7)
PROMPTS = [{"prompt_token_ids": [(i * 11 + j * 5) % 250 + 1 for j in range(2 + 6 * i)]} for i in range(3)]
FAULTY_FORWARD = 3
"""The worker's forward (1-based) at which the mid-run faults strike: after the first steps went through."""


def _raise_at_start(config, group, device) -> None:
    raise RuntimeError("injected start fault")


def _serve_until(config, group, device, fault) -> None:
    """The real worker (executor built as rank 0 builds its own), but `fault()` replaces its FAULTY_FORWARD-th
    forward."""
    executor = engine_setup.worker_executor(config, group, device)
    forward, calls = executor.forward, []

    def counted(inputs):
        calls.append(None)
        if len(calls) == FAULTY_FORWARD:
            fault()
        return forward(inputs)

    executor.forward = counted
    executor.loop()


def _raise_mid_run(config, group, device) -> None:
    def fault():
        raise RuntimeError("injected forward fault")

    _serve_until(config, group, device, fault)


def _die_mid_run(config, group, device) -> None:
    _serve_until(config, group, device, lambda: os._exit(3))


def _parallel_llm(model_dir, monkeypatch, target) -> LLM:
    monkeypatch.setattr(engine_setup, "serve_worker_rank", target)
    return LLM(str(model_dir), num_pages=128, tensor_parallel_size=2)


@pytest.mark.timeout(180)
def test_a_worker_that_fails_to_start_fails_the_engine_start_with_its_error(tiny_model_dir, monkeypatch):
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1 failed:.*injected start fault"):
        _parallel_llm(tiny_model_dir, monkeypatch, _raise_at_start)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("target", "message"),
    [
        (_raise_mid_run, r"(?s)worker rank 1 failed:.*injected forward fault"),
        (_die_mid_run, "worker rank 1 exited with code 3"),
    ],
)
def test_a_worker_that_fails_mid_run_fails_the_step_with_its_error(tiny_model_dir, monkeypatch, target, message):
    llm = _parallel_llm(tiny_model_dir, monkeypatch, target)
    try:
        with pytest.raises(GenerationFailed) as failed:
            llm.generate(PROMPTS, PARAMS)
        outputs = failed.value.outputs
        errors = [o.outputs[0].error for o in outputs]
        assert all(e is not None for e in errors), errors  # all in flight at the third step
        assert all(o.outputs[0].finish_reason == "error" for o in outputs)
        assert re.search(message, errors[0]), errors[0]
        started = time.monotonic()
        with pytest.raises(GenerationFailed) as again:  # no collective is tried again: fails at once
            llm.generate(PROMPTS[:1], PARAMS)
        assert "stopped after a failed step" in str(again.value) and time.monotonic() - started < 5
    finally:
        llm.engine.shutdown()
    workers = llm.engine.runner.executor.runtime.processes
    assert all(not p.is_alive() for p in workers)
