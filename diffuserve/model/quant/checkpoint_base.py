"""What every pre-quantized checkpoint format tells the loader: which of its tensors are parts of one quantized
weight (grouped under the weight's float name, its "base": `...q_proj.weight`, `...experts.gate_up_proj`), the
format those weights take (known from config.json before any tensor is read, so modules are built quantized),
and how one weight's parts decode into the canonical form (formats.py). The subclasses are the formats
(checkpoint_fp8, checkpoint_gptq_awq, checkpoint_ct); checkpoint_config picks one from `quantization_config`.
Knows nothing of modules: the loader routes a decoded weight through the family's names like a float tensor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

from diffuserve.model.quant.formats import QuantFormat, QuantParts

QDATA = "qdata"
"""Role of a base name that itself holds the quantized values (FP8, compressed-tensors int8 / fp8)."""


class CheckpointQuant(ABC):
    label: str
    """For messages: `fp8 (128 x 128 blocks)`, `gptq (int4, groups of 128)`, ..."""
    base_holds_values = False
    """The base name itself is a part (role QDATA) when the base has other parts."""

    def __init__(self, names: Iterable[str]) -> None:
        names = set(names)
        self.roles: dict[str, set[str]] = {}
        """{base: the roles of its parts present in the checkpoint}."""
        for name in names:
            split = self.split(name)
            if split is not None:
                self.roles.setdefault(split[0], set()).add(split[1])
        if self.base_holds_values:
            for base, roles in self.roles.items():
                if base in names:
                    roles.add(QDATA)

    @abstractmethod
    def split(self, name: str) -> tuple[str, str] | None:
        """(base, role) of a tensor that is a part (not the base itself), else None."""

    @abstractmethod
    def format_for(self, base: str) -> QuantFormat:
        """The canonical format weight `base` decodes into."""

    @abstractmethod
    def decode(self, base: str, parts: dict[str, torch.Tensor]) -> tuple[QuantParts, tuple[int, ...]]:
        """One weight's parts {role: tensor} -> (canonical parts, logical shape [*lead, N, K])."""

    def role_of(self, name: str) -> tuple[str, str] | None:
        """(base, role) of any tensor belonging to a quantized weight, the base itself included."""
        if self.base_holds_values and name in self.roles:
            return name, QDATA
        split = self.split(name)
        return split if split is not None and split[0] in self.roles else None

    def is_complete(self, base: str, received: Iterable[str]) -> bool:
        return self.roles[base] <= set(received)


def with_suffix(name: str, suffixes: dict[str, str], base_suffix: str) -> tuple[str, str] | None:
    """`prefix + suffix` -> (prefix + base_suffix, role) for the first matching suffix of `suffixes`."""
    for suffix, role in suffixes.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + base_suffix, role
    return None


def nibbles_of_int32(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] holding eight 4-bit values each, value j at bits 4j -> uint8 [..., 8 W] in that order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed[..., None] >> shifts) & 0xF).to(torch.uint8).flatten(-2)


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K] values 0..15 -> [..., K / 2], even column in the low nibble (the canonical int4)."""
    return values[..., 0::2] | (values[..., 1::2] << 4)


def check_trivial_g_idx(g_idx: torch.Tensor, group_size: int | None, base: str) -> None:
    """Activation-order checkpoints (a g_idx other than k // group_size) need a column permutation we do not run."""
    k = g_idx.shape[-1]
    expected = torch.arange(k, device=g_idx.device) // (group_size or k)
    if not torch.equal(g_idx.long().reshape(-1, k)[0], expected):
        raise ValueError(
            f"checkpoint: {base} has an act-order g_idx (desc_act / actorder group): not supported; use a "
            "checkpoint quantized without activation reordering (desc_act false)"
        )
