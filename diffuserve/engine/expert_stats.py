"""Expert-routing statistics of MoE models, per engine step and per diffusion block.

Reads the routing each MoE layer leaves behind (`last_expert_ids`, [N, K] for the step's N tokens) and keeps:
per step and layer, how many distinct experts the whole batch touched and how unevenly tokens spread over them
(max / mean tokens per touched expert); per request and layer, the union of experts its current block touched
over all of the block's denoising steps. These are the numbers that decide MoE cost in block diffusion (a block
routes many tokens at once, and its expert set barely changes across steps) and that calibrate the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ExpertStatsSnapshot:
    num_experts: int
    experts_touched_per_step: float
    """Distinct experts per MoE layer per step (whole batch), averaged."""
    experts_touched_per_block: float
    """Distinct experts per MoE layer over one block's denoising steps (one request), averaged."""
    tokens_per_expert: float
    """Routed (token, expert) pairs per touched expert per layer-step, averaged."""
    load_imbalance: float
    """max / mean tokens over the touched experts of a layer-step, averaged (1.0 = perfectly even)."""


class ExpertTracker:
    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if hasattr(m, "last_expert_ids")]
        self.num_experts = max((m.num_experts for m in self.layers), default=0)
        self._blocks: dict[str, torch.Tensor] = {}  # request id -> [L, E] bool, the current block's union
        self._step_sums = torch.zeros(3, dtype=torch.float64)  # touched, tokens per expert, imbalance
        self._num_layer_steps = 0
        self._block_touched_sum = 0.0
        self._num_blocks = 0

    @property
    def enabled(self) -> bool:
        return bool(self.layers)

    def record_step(self, block_rows: list[tuple[str, int, int]]) -> None:
        """After a forward. `block_rows`: (request id, first row, row count) of each request's block."""
        for layer_index, layer in enumerate(self.layers):
            ids = layer.last_expert_ids  # [N, K]
            counts = torch.bincount(ids.flatten(), minlength=self.num_experts).double()
            touched = counts[counts > 0]
            self._step_sums += torch.stack(
                (touched.new_tensor(len(touched)), touched.mean(), touched.max() / touched.mean())
            ).cpu()
            self._num_layer_steps += 1
            for request_id, start, length in block_rows:
                union = self._blocks.setdefault(
                    request_id, torch.zeros(len(self.layers), self.num_experts, dtype=torch.bool, device=ids.device)
                )
                union[layer_index, ids[start : start + length].flatten()] = True

    def finish_block(self, request_id: str) -> None:
        """The request's block is final (or the request finished): record its expert union, start a new one."""
        union = self._blocks.pop(request_id, None)
        if union is not None:
            self._block_touched_sum += float(union.sum(dim=1).double().mean())
            self._num_blocks += 1

    def snapshot(self) -> ExpertStatsSnapshot:
        steps = max(self._num_layer_steps, 1)
        touched, per_expert, imbalance = (self._step_sums / steps).tolist()
        per_block = self._block_touched_sum / self._num_blocks if self._num_blocks else 0.0
        return ExpertStatsSnapshot(self.num_experts, touched, per_block, per_expert, imbalance)
