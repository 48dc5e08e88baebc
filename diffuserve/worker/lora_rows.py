"""Each token's LoRA adapter slot in a step batch: from the first row and slot of every run of rows (a request's
queries, its drafting block's rows under a draft adapter, or a prompt-scoring variant's), the [N] long tensor the
model's adapter hooks read (model/lora/layer.py), or None when no token of the step runs with an adapter (the
forward then adds nothing). Knows of a request only its `adapter`."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request


def adapter_slot(request: Request) -> int:
    """The slot of the adapter the request runs with (0: the base model)."""
    return 0 if request.adapter is None else request.adapter.slot


def token_slots(runs: list[tuple[int, int]], num_rows: int, device: torch.device) -> torch.Tensor | None:
    """runs: (first row, adapter slot) in row order, each run lasting until the next one starts (the last: until
    `num_rows`) -> [num_rows] slots, or None if every slot is 0."""
    if not any(slot for _, slot in runs):
        return None
    slots = [0] * num_rows
    for i, (start, slot) in enumerate(runs):
        if slot:
            end = runs[i + 1][0] if i + 1 < len(runs) else num_rows
            slots[start:end] = [slot] * (end - start)
    return torch.tensor(slots, dtype=torch.long, device=device)
