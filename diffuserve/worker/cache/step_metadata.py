"""StepMetadata: a step's cache work as rank 0 plans it, one typed field per cache kind (named page groups, the
recurrent-state plan, the canvas rows), sent as it is to the other ranks. Each kind's tensors turn their field
into the model's `StepInputs` (allocation.CacheTensors.bind). Knows nothing of requests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from diffuserve.model.step_inputs import CanvasInputs
from diffuserve.worker.cache.paged_step import PagedStepMetadata
from diffuserve.worker.cache.state_step import StatePlan


@dataclass(frozen=True)
class StepMetadata:
    pages: dict[str, PagedStepMetadata]
    """Per page group ("kv" for the full-attention layers, then each sliding window's group)."""
    state: StatePlan | None = None
    """The recurrent-state plan of a model with recurrent layers."""
    canvas: CanvasInputs | None = None
    """The canvas rows of a self-conditioned model."""

    def to(self, device: torch.device | str) -> StepMetadata:
        """Every field on `device` (none dropped: a new field moves with `dataclasses.replace` here)."""
        return dataclasses.replace(
            self,
            pages={name: meta.to(device) for name, meta in self.pages.items()},
            state=None if self.state is None else self.state.to(device),
            canvas=None if self.canvas is None else self.canvas.to(device),
        )
