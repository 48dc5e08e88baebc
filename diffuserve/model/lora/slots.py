"""LoRASlots: the model's adapter slots. Loads a PEFT adapter directory into slot s (1..max_loras; slot 0 is the base
model; with a draft adapter, slot max_loras + 1 is its) of every linear it adapts, clears a slot, and hooks a
`LoRAWeights` onto a linear the first time an adapter adapts it. A load is checked whole (config, names, shapes)
before anything is written, so a bad adapter leaves the slots as they were. Knows nothing of adapter names, requests
or which slot is free (the engine's adapter table decides that).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.layers.linear import RowParallelLinear
from diffuserve.model.lora.adapter_config import AdapterError, read_adapter_config
from diffuserve.model.lora.adapter_weights import AdapterTensors, read_adapter_weights
from diffuserve.model.lora.layer import LoRAWeights
from diffuserve.model.quant.linear import QuantLinear


class LoRASlots:
    def __init__(self, model: nn.Module, family: ModelFamily, args: ModelArgs, max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, draft: bool = False) -> None:  # fmt: skip
        self.model, self.family, self.args = model, family, args
        self.max_loras, self.max_rank = max_loras, max_rank
        self.draft_slot = max_loras + 1 if draft else None
        """The draft adapter's slot (`LoRAConfig.draft_adapter`), None without one."""
        self.num_slots = max_loras + 1 + int(draft)
        self.dtype, self.device = dtype, device
        self.layers: dict[str, LoRAWeights] = {}
        """Engine module name -> its hooked adapter weights (only linears some adapter adapted)."""

    def load(self, slot: int, name: str, path: str | Path) -> None:
        """Adapter `name` from directory `path` into `slot` (replacing what it held); AdapterError if it cannot
        be served, the slots then unchanged."""
        assert 1 <= slot < self.num_slots, f"slot {slot} outside 1..{self.num_slots - 1}"
        config = read_adapter_config(Path(path), name, self.max_rank)
        tensors = read_adapter_weights(Path(path), name, config, self.family, self.args)
        shapes = {t.module: self._check(t, name) for t in tensors}
        self.clear(slot)
        for t in tensors:
            if t.module not in self.layers:
                layer = LoRAWeights(*shapes[t.module], self.num_slots, self.max_rank, self.dtype, self.device)
                layer.attach(self.model.get_submodule(t.module))
                self.layers[t.module] = layer
            self.layers[t.module].write(slot, t.row_start, t.rows, t.a, t.b)

    def clear(self, slot: int) -> None:
        for layer in self.layers.values():
            layer.clear(slot)

    def _check(self, tensors: AdapterTensors, name: str) -> tuple[int, int]:
        """(in, out) of the linear `tensors` adapts, after checking A and B fit it."""
        try:
            linear = self.model.get_submodule(tensors.module)
        except AttributeError:
            linear = None
        if not isinstance(linear, (nn.Linear, RowParallelLinear, QuantLinear)):
            raise AdapterError(
                f"adapter {name!r}: {tensors.module!r} is not a linear layer of this model; drop it from target_modules"
            )
        out_features, in_features = _shape(linear)
        rows = out_features if tensors.rows is None else tensors.rows
        if tensors.a.shape[1] != in_features or tensors.b.shape[0] != rows:
            raise AdapterError(
                f"adapter {name!r}: {tensors.module!r} (rows {tensors.row_start}..) takes lora_A [r, {in_features}] "
                f"and lora_B [{rows}, r], the adapter has {list(tensors.a.shape)} and {list(tensors.b.shape)}; it "
                "was trained for another base model"
            )
        return in_features, out_features


def _shape(linear: nn.Module) -> tuple[int, int]:
    """(out, in) of this rank's linear."""
    if isinstance(linear, QuantLinear):
        return linear.out_features, linear.in_features
    weight = linear.weight
    assert isinstance(weight, torch.Tensor)
    return weight.shape[0], weight.shape[1]
