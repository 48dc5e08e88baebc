"""StepInputs: everything a model's `forward(input_ids, positions, step)` reads besides the tokens, as one typed
object: the full-attention layers' inputs, each sliding-window page group's by name, the recurrent-state work of
models with recurrent layers, and the canvas rows of self-conditioned models. A family reads the fields its cache
layout has and ignores the others; adding a cache kind adds a field here, never a positional argument. Knows
nothing of requests, pages or the engine's bookkeeping (the engine's cache kinds fill it in, worker/cache/).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from diffuserve.model.layers.attention import AttentionInputs
from diffuserve.model.shapes import window_group


@dataclass(frozen=True)
class RowGroup:
    """Sequences with runs of the same length L in the step batch."""

    rows: torch.Tensor
    """[S, L] long: the batch row of each token."""
    slots: torch.Tensor
    """[S] long: each sequence's state slot."""
    snapshot_slots: torch.Tensor | None = None
    """[S] long: slots that also receive the state after this run (prefix-cache snapshots), or None."""
    first_slot: int | None = None
    """When `slots` are first_slot, first_slot + 1, ... in row order: the layers read and advance the pool's rows
    in place (a view) instead of gathering and scattering copies of them; None otherwise."""


@dataclass(frozen=True)
class RecurrentStepInputs:
    """Everything the recurrent layers need for one engine step (the pool tensors and the step's index groups)."""

    conv_caches: list[torch.Tensor]
    """Per recurrent layer (in layer order) [num_slots, conv_dim, k - 1]."""
    recurrent_caches: list[torch.Tensor]
    """Per recurrent layer [num_slots, Hv, Dk, Dv] fp32."""
    commits: tuple[RowGroup, ...]
    """Commit runs, grouped by length."""
    blocks: RowGroup | None
    """Every sequence's block (B tokens each), or None when the step has no block."""
    preview: bool
    """Blocks are previewed (block diffusion); False: run causally, the state dropped (autoregressive)."""


@dataclass(frozen=True)
class CanvasInputs:
    """A step's canvas rows for a self-conditioned model (its cache layout keeps a `CanvasState`)."""

    rows: torch.Tensor
    """[M] long: the batch rows of every canvas (block) position, canvases one after another."""
    soft: torch.Tensor
    """[M, H]: their self-conditioning input (`self_conditioning_input` of the previous step's processed logits;
    zeros on a canvas's first step)."""

    def to(self, device: torch.device | str) -> CanvasInputs:
        return CanvasInputs(self.rows.to(device), self.soft.to(device))


@dataclass(frozen=True)
class StepInputs:
    """One forward's inputs beside the tokens and positions (see the module docstring)."""

    attention: AttentionInputs
    """The full-attention layers' inputs: the "kv" page group's (engine), or a dense mask (references)."""
    windows: Mapping[str, AttentionInputs] = field(default_factory=dict)
    """Each sliding-window page group's inputs, by group name (`shapes.window_group`)."""
    recurrent: RecurrentStepInputs | None = None
    """The recurrent-state work of a model with recurrent layers."""
    canvas: CanvasInputs | None = None
    """The canvas rows of a self-conditioned model."""

    def window(self, size: int) -> AttentionInputs:
        """The inputs of the sliding-window layers of window `size`."""
        name = window_group(size)
        if name not in self.windows:
            raise KeyError(f"the step has no inputs for sliding window {size} (groups: {sorted(self.windows)})")
        return self.windows[name]

    def require_recurrent(self) -> RecurrentStepInputs:
        """The recurrent-state work, which a model with recurrent layers cannot run a step without."""
        if self.recurrent is None:
            raise ValueError("the step carries no recurrent-state inputs, which this model's layers need")
        return self.recurrent

    def require_canvas(self) -> CanvasInputs:
        """The canvas rows, which a self-conditioned model cannot run a step without."""
        if self.canvas is None:
            raise ValueError("the step carries no canvas inputs, which this self-conditioned model needs")
        return self.canvas
