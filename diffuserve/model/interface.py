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


class DiffusionModel(nn.Module, ABC):
    @property
    def step_rules(self) -> StepRules:
        """Default: block-causal attention, each position predicted from its own row."""
        return StepRules()

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] fp32."""
