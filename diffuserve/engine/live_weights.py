"""Changing an engine's weights while it runs: `update_weights` (a checkpoint directory or a state dict, copied in
place by worker/weight_update.py) flushes the prefix cache; `sleep` / `wake_up` free and restore the weights'
device memory. Each refuses while requests are in flight, so that a request runs on one set of weights from start
to end: the server (server/adapter_routes.py) waits for them and holds new ones meanwhile; offline callers finish
or abort them first. Knows nothing of HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffuserve.worker import weight_update
from diffuserve.worker.weight_update import WeightSource

if TYPE_CHECKING:
    from diffuserve.engine.llm_engine import LLMEngine


def update_weights(engine: LLMEngine, source: WeightSource) -> None:
    """Replaces the weights in place and flushes the prefix cache; RuntimeError with requests in flight,
    ValueError naming what does not match the served model."""
    _check_idle(engine, "update_weights")
    weight_update.update_weights(engine.runner.executor, engine.config, source)
    engine.cache.flush_prefix_cache()


def sleep(engine: LLMEngine) -> None:
    """Frees the weights' device memory (a GPU; a CPU engine does nothing) until `wake_up`."""
    _check_idle(engine, "sleep")
    weight_update.sleep(engine.runner.executor, engine.config)


def wake_up(engine: LLMEngine) -> None:
    weight_update.wake_up(engine.runner.executor)


def _check_idle(engine: LLMEngine, what: str) -> None:
    scheduler = engine.scheduler
    if scheduler.has_unfinished:
        num = len(scheduler.waiting) + len(scheduler.running)
        raise RuntimeError(f"{what}: {num} requests are in flight; let them finish or abort them first")
