"""The per-step context offloaded MoE layers read: the step's diffusion blocks (their rows in the batch, and which
are at their first step) and, for a window coreset rule, the step's windows (window_coreset.py). The engine
builds it only when expert offload or block coreset routing (coreset.py) is on and sets it around the forward,
so the layers' signatures stay those of a plain forward. Knows nothing of requests beyond a block's key.

Scoped: `offload_context` refuses nesting and always clears itself; reading it outside one is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockRef:
    """One request's diffusion block in the step batch."""

    key: tuple[str, int]
    """(request id, block start): the same across the block's steps."""
    start: int
    """Row of the block's first token in the step batch."""
    length: int
    is_first_step: bool


@dataclass(frozen=True)
class OffloadContext:
    blocks: tuple[BlockRef, ...]
    """The step's blocks, in batch order (picklable: worker ranks receive it with the forward's inputs)."""
    windows: tuple[tuple[int, int], ...] = ()
    """(first row, row count) of every window of the step's rows, in row order; empty unless a coreset rule
    applies to every window (the cumulative rule)."""


_CURRENT: ContextVar[OffloadContext | None] = ContextVar("offload_context", default=None)


@contextmanager
def offload_context(context: OffloadContext) -> Iterator[OffloadContext]:
    """Makes `context` the current one for the duration of one forward."""
    assert _CURRENT.get() is None, "offload_context is not reentrant: one forward at a time"
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


def active_offload_context() -> OffloadContext | None:
    """The context of the forward in progress, or None outside one (a forward the engine did not start)."""
    return _CURRENT.get()


def current_offload_context() -> OffloadContext:
    """The context of the forward in progress; raises if no `offload_context` is active."""
    context = _CURRENT.get()
    if context is None:
        raise RuntimeError("an offloaded MoE layer ran outside offload_context (the engine sets it around a forward)")
    return context
