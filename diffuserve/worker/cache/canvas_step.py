"""The CanvasState kind's torch side (renoise canvases): the self-conditioning pool, a row of [C, H] per canvas
slot, on rank 0 (the model runner writes it after decoding each step and gathers a step's rows from it; the
gathered rows travel to the other ranks with the step's inputs, so they keep no pool). Which slot belongs to
whom is canvas.py's business; what the model does with the rows is its own (`DiffusionModel.forward`'s
`CanvasInputs`, `self_conditioning_input`).

    soft   [num_slots, C, H]   model dtype: slot s holds the soft embeddings of its canvas's last step
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.model.shapes import CanvasState
from diffuserve.model.step_inputs import CanvasInputs
from diffuserve.worker.cache.paged_step import TORCH_DTYPES


@dataclass
class CanvasTensors:
    soft: torch.Tensor

    @classmethod
    def allocate(cls, spec: CanvasState, num_slots: int, device: torch.device) -> CanvasTensors:
        shape = (num_slots, spec.canvas_length, spec.hidden_size)
        return cls(torch.zeros(shape, dtype=TORCH_DTYPES[spec.dtype], device=device))

    @property
    def slot_bytes(self) -> int:
        return self.soft[0].numel() * self.soft.element_size()

    def inputs(self, rows: list[int], slots: list[int], first_steps: list[bool]) -> CanvasInputs:
        """The step's canvas rows (`rows` [M], canvases one after another) and their self-conditioning input:
        slot `slots[i]`'s row for canvas i, zeros where `first_steps[i]` (a canvas's first step)."""
        device = self.soft.device
        index = torch.tensor(slots, dtype=torch.long, device=device)
        soft = self.soft.index_select(0, index)  # [canvases, C, H]
        soft[torch.tensor(first_steps, dtype=torch.bool, device=device)] = 0
        return CanvasInputs(torch.tensor(rows, dtype=torch.long, device=device), soft.flatten(0, 1))

    def keep(self, slots: list[int], soft: torch.Tensor) -> None:
        """soft [canvases x C, H]: each canvas's next self-conditioning input, into its slot."""
        index = torch.tensor(slots, dtype=torch.long, device=self.soft.device)
        self.soft.index_copy_(0, index, soft.view(len(slots), *self.soft.shape[1:]).to(self.soft.dtype))

    def bind(self, meta: CanvasInputs) -> CanvasInputs:
        return meta
