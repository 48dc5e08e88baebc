"""Keeps Python's cyclic garbage collector off the objects an engine holds for its whole life.

A loaded engine's process tracks a few hundred thousand container objects (torch, transformers, the tokenizer,
the model's modules) that live as long as it does. The collector's oldest generation scans all of them whenever it
runs, which the engine's per-step allocations trigger every few hundred steps: a stall of about 0.2 s on a 2-core
CPU in the middle of a step (at 128 concurrent on clover-moe-tiny, an ITL p99 of 0.23 s against a p50 of 0.017 s
without the freeze: docs/benchmarks/hotspots.md, hotspot 9). Moving the
objects that exist once the engine is up into the collector's permanent generation (`gc.freeze`) leaves it only
the objects the steps create, as SGLang's `freeze_gc` and vLLM's post-warm-up freeze do.

- `freeze_heap(context)`: for a process that serves one engine until it exits (`diffuserve serve`, a worker rank):
  collects once, then freezes everything alive.
- `frozen_heap()`: for a bounded run inside a process that builds and drops engines (`LLM.generate`, the
  benchmarks): freezes what is alive at entry and unfreezes it at exit, both constant-time list splices, so that
  what the run drops later is collected as usual. A no-op where the heap is frozen already.

Frozen objects are never collected; what a frozen engine holds in reference cycles is freed only after an
unfreeze, which is why the scoped form unfreezes. Knows nothing of engines.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


def freeze_heap(context: str) -> int:
    """Collects, then moves every object alive into the permanent generation; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%s: %d objects frozen out of the garbage collector's scans", context, frozen)
    return frozen


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Every object alive at entry is left out of the collector's scans until exit (unless the heap is frozen
    already, which stays so)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
