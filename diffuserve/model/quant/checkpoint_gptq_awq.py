"""The two classic int4 checkpoint layouts (`quant_method: gptq` / `awq`), per linear layer `X`:

    GPTQ  X.qweight int32 [K / 8, N]   packed along the *input*: word i holds rows 8i .. 8i + 7, row 8i + j at
                                       bits 4j
          X.qzeros  int32 [G, N / 8]   packed along the output the same way; `checkpoint_format` gptq (v1)
                                       stores zero - 1, gptq_v2 the zero itself
          X.scales  fp16  [G, N];  X.g_idx int32 [K] (the group of each input column)
    AWQ   X.qweight int32 [K, N / 8]   packed along the *output* in AWQ's order: the value at bits 4i is column
                                       8c + AWQ_ORDER[i]
          X.qzeros  int32 [G, N / 8]   same packing;  X.scales fp16 [G, N]  (version gemm)

Both dequantize as W[n, k] = (q[k, n] - zero[g, n]) * scale[g, n] with g = k // group_size; symmetric GPTQ's
zeros are 8. Only 4 bits, and no activation order (a g_idx other than k // group_size), are supported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from diffuserve.model.quant.checkpoint_base import (
    CheckpointQuant,
    check_trivial_g_idx,
    nibbles_of_int32,
    pack_nibbles,
    with_suffix,
)
from diffuserve.model.quant.formats import QuantFormat, QuantParts

SUFFIXES = {".qweight": "qweight", ".qzeros": "qzeros", ".scales": "scales", ".g_idx": "g_idx"}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_COLUMN_POSITION = tuple(AWQ_ORDER.index(j) for j in range(8))
"""Bit position (in 4-bit steps) of column j of an AWQ pack of 8."""


def _group_size(config: dict[str, Any]) -> int | None:
    group = config.get("group_size", 128)
    return None if group in (-1, None) else int(group)


class GptqAwqCheckpoint(CheckpointQuant):
    def __init__(self, config: dict[str, Any], names: Iterable[str]) -> None:
        self.method = config["quant_method"]
        bits = config.get("bits", config.get("w_bit", 4))
        if bits != 4:
            raise ValueError(f"quantization_config.bits: {bits} is not supported; only 4-bit {self.method} loads")
        self.group_size = _group_size({"group_size": config.get("group_size", config.get("q_group_size", 128))})
        self.v1 = self.method == "gptq" and config.get("checkpoint_format", "gptq") == "gptq"
        if self.method == "gptq":
            if config.get("desc_act"):
                raise ValueError("quantization_config.desc_act: true (activation order) is not supported")
            symmetric = bool(config.get("sym", True))
        else:
            version = str(config.get("version", "gemm")).lower()
            if version != "gemm":
                raise ValueError(f"quantization_config.version: {version!r} is not supported; only gemm AWQ loads")
            if not config.get("zero_point", True):
                raise ValueError("quantization_config.zero_point: false is not supported; AWQ loads with zero points")
            symmetric = False
        self.format = QuantFormat("int4", self.group_size, symmetric=symmetric)
        self.label = f"{self.method} ({self.format.describe()})"
        super().__init__(names)

    def split(self, name: str) -> tuple[str, str] | None:
        return with_suffix(name, SUFFIXES, ".weight")

    def format_for(self, base: str) -> QuantFormat:
        return self.format

    def decode(self, base: str, parts: dict[str, torch.Tensor]) -> tuple[QuantParts, tuple[int, ...]]:
        if "g_idx" in parts:
            check_trivial_g_idx(parts["g_idx"], self.group_size, base)
        if self.method == "gptq":
            values = _gptq_values(parts["qweight"])  # [K, N]
            zeros = nibbles_of_int32(parts["qzeros"]).to(torch.int16) + (1 if self.v1 else 0)  # [G, N]
        else:
            values = _awq_unpack(parts["qweight"])  # [K, N]
            zeros = _awq_unpack(parts["qzeros"]).to(torch.int16)
        scale = parts["scales"].transpose(0, 1).contiguous()  # [N, G]
        zero = None if self.format.symmetric else zeros.transpose(0, 1).to(scale.dtype).contiguous()
        qdata = pack_nibbles(values.transpose(0, 1).contiguous())  # [N, K / 2]
        return QuantParts(qdata, scale, zero), (values.shape[1], values.shape[0])


def _gptq_values(qweight: torch.Tensor) -> torch.Tensor:
    """[K / 8, N] packed along K -> [K, N] values."""
    k8, n = qweight.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    return ((qweight[:, None, :] >> shifts[None, :, None]) & 0xF).to(torch.uint8).reshape(k8 * 8, n)


def _awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """[R, C / 8] in AWQ's order -> [R, C] values in column order."""
    by_position = nibbles_of_int32(packed).view(packed.shape[0], -1, 8)  # [R, C / 8, 8]
    return by_position[..., list(AWQ_COLUMN_POSITION)].reshape(packed.shape[0], -1)
