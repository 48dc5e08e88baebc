"""DiffusionModel: what every family's model (and every stand-in for one, e.g. the transformers reference of
`bench compare`) offers its callers beyond being an nn.Module. The loader returns one, the engine's model runners
and the test oracles call it. Its `forward` is family-specific (dense or paged attention inputs, plus recurrent
inputs for hybrid models) and returns hidden states before the LM head; `compute_logits` maps chosen rows of
them to fp32 logits, so that the head runs only over the positions a decoder reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn


class DiffusionModel(nn.Module, ABC):
    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] fp32."""
