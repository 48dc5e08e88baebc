"""DiffusionGemma's side of `diffuserve verify`: one denoising forward of a canvas after a prompt, on both sides,
with every layer's output kept.

DiffusionGemma has no causal trunk with logits: transformers' `DiffusionGemmaForBlockDiffusion` runs its encoder
layers over the prompt and its decoder layers over the canvas (the prompt's K/V in view); the engine runs both
roles in one dense forward under the masks of diffusion_gemma/masks.py, prompt rows first. Layer i is compared
over the whole sequence: the reference's encoder layer i on the prompt rows, its decoder layer i on the canvas
rows. The canvas is seeded random ids (a first denoising step's, without self-conditioning); the logits are the
canvas's. Knows nothing of tolerances.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.diffusion_gemma.config import gemma_args
from diffuserve.model.families.diffusion_gemma.masks import dense_inputs
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.shapes import window_group
from diffuserve.model.step_inputs import CanvasInputs, StepInputs
from diffuserve.verify.runners import CausalRun, captured

ENCODER_LAYERS, DECODER_LAYERS = "model.encoder.language_model.layers", "model.decoder.layers"
"""Where transformers' DiffusionGemmaForBlockDiffusion keeps each role's layers."""


def canvas_ids(vocab_size: int, length: int, count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (length,), generator=generator).tolist() for _ in range(count)]


class OursCanvasRunner:
    def __init__(self, model: DiffusionModel, args: ModelArgs, device: torch.device) -> None:
        self.model, self.args, self.device = model, args, device
        self.layers = cast(nn.ModuleList, model.get_submodule("model.layers"))

    def run(self, prompt: list[int], canvas: list[int]) -> CausalRun:
        ids = torch.tensor([prompt + canvas], device=self.device)  # [1, P + C]: the prompt's rows, then the canvas
        positions = torch.arange(ids.shape[1], device=self.device)
        is_canvas = positions >= len(prompt)
        attn = dense_inputs(gemma_args(self.args), positions, is_canvas)
        soft = torch.zeros(
            len(canvas), self.args.hidden_size, device=self.device, dtype=next(self.model.parameters()).dtype
        )
        sliding_window = cast(Any, self.model).sliding_window
        step = StepInputs(
            attn.full,
            {window_group(sliding_window): attn.sliding},
            canvas=CanvasInputs(is_canvas.nonzero()[:, 0], soft),
        )
        with torch.no_grad(), captured(self.layers) as hidden:
            out = self.model(ids, positions[None], step)
            logits = self.model.compute_logits(out[:, len(prompt) :])
        return CausalRun(hidden, logits[0].float().cpu())


class ReferenceCanvasRunner:
    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.encoder = cast(nn.ModuleList, model.get_submodule(ENCODER_LAYERS))
        self.decoder = cast(nn.ModuleList, model.get_submodule(DECODER_LAYERS))

    def run(self, prompt: list[int], canvas: list[int]) -> CausalRun:
        ids, canvas_t = (torch.tensor([t], device=self.device) for t in (prompt, canvas))
        with torch.no_grad(), captured(self.encoder) as encoded, captured(self.decoder) as decoded:
            logits = self.model(input_ids=ids, decoder_input_ids=canvas_t).logits
        hidden = [torch.cat([e, d]) for e, d in zip(encoded, decoded, strict=True)]
        return CausalRun(hidden, logits[0].float().cpu())
