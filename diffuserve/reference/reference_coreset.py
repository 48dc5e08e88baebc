"""Block expert coreset routing in the naive reference, written from its rule in docs/models/coreset.md and sharing no
code with the engine's routing or dispatch (model/layers/moe/coreset.py, dispatch.py): while the reference
computes a step of the block at rows [start, end), every MoE layer's output at those rows is replaced by this
module's own computation, expert by expert and position by position:

    1. p = softmax(router logits) per position (fp32);
    2. the coreset: the C experts with the largest sum of p over the block's positions (ties: lower id);
    3. each position: its k most probable coreset experts (ties: lower id), weights p / (sum of those k);
    4. out = sum over those k of weight * SwiGLU_expert(x), plus the layer's shared expert.

Rows before the block (the prefix the reference recomputes) keep the layer's own per-token routing. C at or above
a layer's experts leaves the layer alone. Only layers with a softmax router (`gate.weight`, `gate.top_k`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.layers.moe.layer import SparseMoeBlock


@contextmanager
def block_coreset_routing(model: nn.Module, start: int, end: int, size: int) -> Iterator[None]:
    """Within the context, the MoE layers of `model` route rows [start, end) of a [1, T] forward by the coreset."""
    layers = [m for m in model.modules() if isinstance(m, SparseMoeBlock) and 0 < size < m.num_experts]

    def replace_rows(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert isinstance(module, SparseMoeBlock)
        x = inputs[0].reshape(-1, inputs[0].shape[-1])  # [T, H]
        out = output.reshape(-1, output.shape[-1]).clone()
        out[start:end] = _coreset_layer(module, x[start:end], size)
        return out.view(output.shape)

    hooks = [layer.register_forward_hook(replace_rows) for layer in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _coreset_layer(layer: SparseMoeBlock, x: torch.Tensor, size: int) -> torch.Tensor:
    """x [L, H]: one block's rows -> the layer's output there under the coreset rule [L, H]."""
    gate: Any = layer.gate
    probs = torch.softmax(F.linear(x, gate.weight).float(), dim=-1)  # [L, E]
    num_experts = probs.shape[1]
    totals = [sum(probs[i, e].item() for i in range(x.shape[0])) for e in range(num_experts)]
    coreset = sorted(range(num_experts), key=lambda e: (-totals[e], e))[:size]
    rows = []
    for i in range(x.shape[0]):
        chosen = sorted(coreset, key=lambda e: (-probs[i, e].item(), e))[: gate.top_k]
        picked = probs[i, chosen]  # [K] fp32
        weights = (picked / picked.sum()).to(x.dtype)
        row = torch.zeros(x.shape[1], dtype=weights.dtype)
        for weight, expert in zip(weights, chosen):
            row = row + weight * expert_output(layer, expert, x[i]).to(weights.dtype)
        rows.append(row.to(x.dtype))
    out = torch.stack(rows)
    shared = layer.shared_output(x)
    return out if shared is None else out + shared


def expert_output(layer: SparseMoeBlock, expert: int, x: torch.Tensor) -> torch.Tensor:
    """One routed expert's SwiGLU on one row x [H] (weights [2I, H] = gate rows then up rows, and [H, I])."""
    gate_up, down = layer.experts.gate_up_proj[expert], layer.experts.down_proj[expert]
    width = down.shape[1]
    gate, up = gate_up[:width] @ x, gate_up[width:] @ x
    return down @ (F.silu(gate) * up)
