"""DiffusionModel: what every family's model (and every stand-in for one, e.g. the transformers reference of
`bench compare`) offers its callers beyond being an nn.Module. The loader returns one, the engine's model runner
and the test oracles call it. Its `forward` is family-specific (dense or paged attention inputs, then one input
per further cache kind of its layout, e.g. the recurrent state of hybrid models) and returns hidden states before
the LM head; `compute_logits` maps chosen rows of them to fp32 logits, so that the head runs only over the
positions a decoder reads. `step_rules` says how an engine step reads the model (which keys a query sees, which
row predicts a position), and the family's cache layout (model/registry.py) the cache each layer needs, so the
engine needs no family-specific code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StepRules:
    """How the engine lays out a step for this model."""

    prediction_shift: bool = False
    """Position p is predicted from the output row of p - 1 (the AR shift: next-token models adapted to block
    diffusion); a block's first position then comes from the last committed position's row."""
    causal_commits: bool = False
    """Committed positions attend causally (a recurrent prefix is causal), not block-causally."""
    autoregressive: bool = False
    """No block diffusion: one token per step, the block's first masked position, read through a causal pass."""
    renoise_canvas: bool = False
    """Blocks are renoise canvases (DiffusionGemma, as transformers' `generate` runs it): a request's block starts
    at its committed length instead of on the position-0 grid, so prefill commits the whole prompt; it holds
    random tokens, never masks, is decoded by the renoise decoder only (every position read every step) and is
    committed whole once that decoder ends it. With `causal_commits` a page's K/V depend on the tokens up to it
    only, so pages need not hold whole blocks."""
    block_window_from_start: bool = False
    """On sliding-window layers a block's rows share the window behind the block's first position (the block is
    denoised as a whole: DiffusionGemma's canvas rows see the W - 1 positions before the canvas); otherwise every
    row's window ends at its own position."""

    def page_multiple(self, block_length: int) -> int:
        """What a page size must be a multiple of: the block length (a page's K/V then belong to whole blocks,
        as their content hash assumes), or 1 for renoise canvases over causal commits."""
        return 1 if self.renoise_canvas and self.causal_commits else block_length


class DiffusionModel(nn.Module, ABC):
    @property
    def step_rules(self) -> StepRules:
        """Default: block-causal attention, each position predicted from its own row."""
        return StepRules()

    def set_recurrent_backend(self, backend: str, device: torch.device) -> None:
        """Picks the kernels of the model's recurrent layers (`--gdn-backend`); a model without any has none."""

    def self_conditioning_input(self, logits: torch.Tensor) -> torch.Tensor:
        """A canvas step's processed logits [M, V] -> the next step's self-conditioning input [M, H], for models
        whose cache layout keeps one (`CanvasState`); the others take none."""
        raise NotImplementedError(f"{type(self).__name__} takes no self-conditioning input")

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] fp32."""
