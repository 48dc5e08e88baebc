"""Whether and how the model forward is compiled (`EngineConfig.enforce_eager`), and what compiling cost.

Default (`enforce_eager=None`): compiled on CUDA with `mode="reduce-overhead"` (CUDA graphs: the step's hundreds
of small kernels replayed as one launch), eager on CPU, where inductor compiled the benchmark model for 105-144 s
on a shared 2-core machine and ran fp32 at 0.63-0.69x eager (bf16 1.73x, but with tokens that differ from eager;
docs/benchmarks.md, "Batch-1 speed"). `enforce_eager=False` compiles on CPU too. Shapes are marked dynamic, so
the steps' varying token counts reuse one graph instead of recompiling per count. The first call pays the
compile; its time is logged and kept in `compile_s` (a later recompile, for a shape the dynamic marking does not
cover, is not counted; padded shape buckets that would rule those out are not built yet).
Knows nothing of the model's structure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def should_compile(enforce_eager: bool | None, device: torch.device) -> bool:
    return not enforce_eager if enforce_eager is not None else device.type == "cuda"


class CompiledForward:
    """`model`'s forward, compiled or not; call it as the model. `compile_s`: seconds spent in the first call."""

    def __init__(self, model: nn.Module, compiled: bool, device: torch.device) -> None:
        self.compiled = compiled
        self.compile_s = 0.0
        self._first_call = compiled
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._fn: Callable[..., Any] = torch.compile(model, dynamic=True, mode=mode) if compiled else model

    def __call__(self, *args: Any) -> torch.Tensor:
        if not self._first_call:
            return self._fn(*args)
        started = time.perf_counter()
        out = self._fn(*args)
        self.compile_s += time.perf_counter() - started
        self._first_call = False
        logger.info("compiled the model forward in %.1f s", self.compile_s)
        return out
