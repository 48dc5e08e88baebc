"""Bytes of a loaded model's weights by kind, as they sit in memory (quantized weights with their scales and
zeros in their kernels' layouts): what the planner predicts (`diffuserve plan --weight-dtype`) and what a
benchmark's bytes per forward are made of. Tied tensors count once. Knows nothing of requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class WeightBytes:
    routed_experts: int
    input_embedding: int
    gdn: int
    """Gated DeltaNet mixers (`linear_attn`)."""
    other: int
    """Everything else: attention, shared experts, dense MLPs, routers, norms, LM head (when untied)."""
    tied_head: bool = False
    """The LM head is the embedding table (then every forward reads it in full, as the head)."""

    @property
    def total(self) -> int:
        return self.routed_experts + self.input_embedding + self.gdn + self.other

    @property
    def per_forward_dense(self) -> int:
        """What every forward reads in full: all but the routed experts and the embedding lookup."""
        return self.gdn + self.other + (self.input_embedding if self.tied_head else 0)


def weight_bytes(model: nn.Module, tied_head: bool = False) -> WeightBytes:
    kinds = {"routed_experts": 0, "input_embedding": 0, "gdn": 0, "other": 0}
    for name, param in model.named_parameters():  # tied parameters are listed once
        size = param.numel() * param.element_size()
        if ".mlp.experts." in name:
            kinds["routed_experts"] += size
        elif name.endswith("embed_tokens.weight"):
            kinds["input_embedding"] += size
        elif ".linear_attn." in name:
            kinds["gdn"] += size
        else:
            kinds["other"] += size
    return WeightBytes(**kinds, tied_head=tied_head)
