"""Each token's LoRA adapter slot in a step batch: from the first row of every request's run of rows (its
queries, or a prompt-scoring variant's), the [N] long tensor the model's adapter hooks read (model/lora/layer.py),
or None when no token of the step runs with an adapter (the forward then adds nothing). Knows of a request only
its `adapter`."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request


def token_slots(runs: list[tuple[int, Request]], num_rows: int, device: torch.device) -> torch.Tensor | None:
    """runs: (first row, request) in row order, each run lasting until the next one starts (the last: until
    `num_rows`) -> [num_rows] slots, or None if every slot is 0."""
    if all(request.adapter is None for _, request in runs):
        return None
    slots = [0] * num_rows
    for i, (start, request) in enumerate(runs):
        if request.adapter is not None:
            end = runs[i + 1][0] if i + 1 < len(runs) else num_rows
            slots[start:end] = [request.adapter.slot] * (end - start)
    return torch.tensor(slots, dtype=torch.long, device=device)
