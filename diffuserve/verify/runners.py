"""One causal forward of either side of `diffuserve verify`, with every decoder layer's output kept.

Both sides run the same prompt under the causal mask: the engine's model (Clover read whole,
model/families/clover_moe/dense.py, whose per-layer modules the hooks see; the block-diffusion transformers through
their own forward with a dense causal mask) and the reference through its
`forward` with `use_cache=False` (with no mask for a model with recurrent layers, whose transformers code builds
the causal one itself; otherwise an explicit 4-D causal mask, since some checkpoints' code, LLaDA2's, is
bidirectional when given none). That mask is written in one of two conventions (MASK_CONVENTIONS): additive
(0 where a position may attend, -inf where not: transformers' and LLaDA2's) or boolean (True where it may attend:
SDAR's eval attention calls `attention_mask.bool()`, which reads an additive mask inside out); the session tries
both where the first parts. Layer outputs are taken by forward hooks on each side's list of decoder layers, so
neither model's code changes. Knows nothing of tolerances.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs


@dataclass(frozen=True)
class CausalRun:
    hidden: list[torch.Tensor]
    """Each decoder layer's output [T, H] (fp32, on the CPU), layer 0 first."""
    logits: torch.Tensor
    """[T, V] fp32."""


@contextmanager
def captured(layers: Iterable[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """Collects each layer's output (the first element of a tuple output) while the block runs."""
    outputs: list[torch.Tensor] = []

    def keep(module: nn.Module, inputs: object, output: object) -> None:
        tensor = output[0] if isinstance(output, tuple) else output
        assert isinstance(tensor, torch.Tensor), f"{type(module).__name__} returned {type(output).__name__}"
        outputs.append(tensor.detach()[0].float().cpu())

    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The model's list of decoder layers: the shortest-named `*layers` ModuleList of `num_layers` entries."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and name.endswith("layers") and len(module) == num_layers
    ]
    if not found:
        raise ValueError(f"reference: no list of {num_layers} decoder layers found in {type(model).__name__}")
    return min(found, key=lambda item: len(item[0]))[1]


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, T] bool: position q sees k <= q."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


class OursRunner:
    def __init__(self, model: DiffusionModel, device: torch.device) -> None:
        self.model, self.device = model, device
        # A model with recurrent layers is read whole over dense per-sequence state (its serving forward needs the
        # engine's state pool); the hooks then sit on that reading's layers.
        self.dense = DenseClover(model) if isinstance(model, CloverMoeForBlockDiffusion) else None
        num_layers = len(cast(nn.ModuleList, model.get_submodule("model.layers")))
        self.layers = decoder_layers(self.dense or model, num_layers)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """[T, V] fp32 logits of the prompt `ids`."""
        return self.model.compute_logits(self._hidden(ids))[0].cpu()

    def run(self, ids: list[int]) -> CausalRun:
        with torch.no_grad(), captured(self.layers) as hidden:
            logits = self.logits(ids)
        return CausalRun(hidden, logits)

    def _hidden(self, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], device=self.device)
        if self.dense is not None:
            return self.dense.forward_causal(tokens)[0]
        positions = torch.arange(len(ids), device=self.device)[None]
        return self.model(tokens, positions, StepInputs(DenseAttentionInputs(causal_mask(len(ids), self.device))))


MASK_CONVENTIONS = {
    "additive": "additive 0 / -inf",
    "boolean": "boolean (True = attend)",
    "none": "none (the reference builds its causal mask)",
}
"""How a reference reads a 4-D attention mask -> how the report names it."""


class ReferenceRunner:
    def __init__(self, model: nn.Module, num_layers: int, device: torch.device, convention: str) -> None:
        self.model, self.device, self.convention = model, device, convention
        self.layers = decoder_layers(model, num_layers)

    def _mask(self, length: int) -> torch.Tensor | None:
        """[1, 1, T, T] causal mask in the runner's convention (None: the reference builds its own)."""
        if self.convention == "none":
            return None
        mask = causal_mask(length, self.device)
        if self.convention == "boolean":
            return mask
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(~mask, float("-inf"))

    def logits(self, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], device=self.device)
        if self.convention == "none":
            return self.model(input_ids=tokens, use_cache=False).logits[0].float().cpu()
        positions = torch.arange(len(ids), device=self.device)[None]
        out = self.model(input_ids=tokens, attention_mask=self._mask(len(ids)), position_ids=positions, use_cache=False)
        return out.logits[0].float().cpu()

    def run(self, ids: list[int]) -> CausalRun:
        with torch.no_grad(), captured(self.layers) as hidden:
            logits = self.logits(ids)
        return CausalRun(hidden, logits)
