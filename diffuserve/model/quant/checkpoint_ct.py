"""compressed-tensors checkpoints (`quant_method: compressed-tensors`, written by llm-compressor and by
`diffuserve quantize`), read by the rules of the `compressed-tensors` library (its PackedQuantizationCompressor
and NaiveQuantizationCompressor, which tests/model/quant use as the oracle):

    pack-quantized   X.weight_packed int32 [N, ceil(K / 8)]: value q + 8 of column i at bits 4 (i % 8) of word
                     i // 8 (little-endian bytes: the canonical nibbles); 8-bit: q + 128, one byte per column;
                     X.weight_scale [N, G] (group) or [N, 1] (channel); X.weight_zero_point int32
                     [ceil(N / 8), G] packed along N, zp + 8 (asymmetric only); X.weight_shape [N, K]
    int-quantized /  X.weight int8 or float8_e4m3fn [N, K], X.weight_scale [N, 1] (channel), [N / bn, K / bk]
    float-quantized  (block) or one number (tensor)

W = (q - zp) * scale. The scheme of each weight is the first `config_groups` entry whose `targets` match its
module ("Linear", `re:` regexes or names). Supported: 4-bit int weights (pack-quantized), 8-bit int channel
weights, fp8 weights with dynamic or no activation quantization.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

import torch

from diffuserve.model.quant.checkpoint_base import (
    QDATA,
    CheckpointQuant,
    check_trivial_g_idx,
    nibbles_of_int32,
    with_suffix,
)
from diffuserve.model.quant.formats import QuantFormat, QuantParts

SUFFIXES = {
    ".weight_packed": "packed",
    ".weight_scale": "scale",
    ".weight_zero_point": "zero_point",
    ".weight_shape": "shape",
    ".weight_g_idx": "g_idx",
}


def _matches(targets: list[str], module: str) -> bool:
    for target in targets:
        if target == "Linear" or target == module or (target.startswith("re:") and re.fullmatch(target[3:], module)):
            return True
    return False


def _format_of(weights: dict[str, Any], group: str) -> QuantFormat:
    """A config group's `weights` args -> our canonical format (unsupported ones: a one-line error)."""
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    strategy, symmetric = weights.get("strategy", "tensor"), bool(weights.get("symmetric", True))
    where = f"quantization_config.config_groups.{group}.weights"
    if kind == "float" and bits == 8:
        if strategy == "block":
            rows, cols = weights["block_structure"]
            return QuantFormat("fp8", cols, rows)
        return QuantFormat("fp8")
    if kind == "int" and bits == 4 and strategy in ("group", "channel"):
        return QuantFormat("int4", weights.get("group_size") if strategy == "group" else None, symmetric=symmetric)
    if kind == "int" and bits == 8 and strategy in ("channel", "tensor") and symmetric:
        return QuantFormat("int8")
    raise ValueError(
        f"{where}: {kind} {bits}-bit {strategy} ({'symmetric' if symmetric else 'asymmetric'}) is not supported; "
        "supported: int 4-bit group/channel, int 8-bit symmetric channel, float 8-bit"
    )


class CompressedTensorsCheckpoint(CheckpointQuant):
    base_holds_values = True
    label = "compressed-tensors"

    def __init__(self, config: dict[str, Any], names: Iterable[str]) -> None:
        self.groups: list[tuple[list[str], QuantFormat]] = []
        for group, entry in (config.get("config_groups") or {}).items():
            activations = entry.get("input_activations")
            if activations and not activations.get("dynamic", False):
                raise ValueError(
                    f"quantization_config.config_groups.{group}.input_activations: static activation scales are "
                    "not supported; only weight-only or dynamic-activation checkpoints load"
                )
            self.groups.append((list(entry.get("targets", [])), _format_of(entry.get("weights") or {}, group)))
        if not self.groups:
            raise ValueError("quantization_config.config_groups: empty; nothing says how the weights are quantized")
        self.label = "compressed-tensors (" + ", ".join(sorted({f.describe() for _, f in self.groups})) + ")"
        super().__init__(names)

    def split(self, name: str) -> tuple[str, str] | None:
        return with_suffix(name, SUFFIXES, ".weight")

    def format_for(self, base: str) -> QuantFormat:
        module = base.removesuffix(".weight")
        for targets, fmt in self.groups:
            if _matches(targets, module):
                return fmt
        raise ValueError(f"checkpoint: {base} is quantized but no quantization_config.config_groups entry targets it")

    def decode(self, base: str, parts: dict[str, torch.Tensor]) -> tuple[QuantParts, tuple[int, ...]]:
        fmt = self.format_for(base)
        if "g_idx" in parts:
            check_trivial_g_idx(parts["g_idx"], fmt.group_size, base)
        if "packed" in parts:
            return _decode_packed(fmt, parts, base)
        qdata, scale = parts[QDATA], parts["scale"]
        n = qdata.shape[0]
        if scale.numel() == 1:  # one scale per tensor -> per row (exact)
            scale = scale.reshape(1, 1).expand(n, 1)
        return QuantParts(qdata, scale.float() if fmt.method == "fp8" else scale, None), tuple(qdata.shape)


def _decode_packed(fmt: QuantFormat, parts: dict[str, torch.Tensor], base: str) -> tuple[QuantParts, tuple[int, ...]]:
    if sys.byteorder != "little":
        raise ValueError("compressed-tensors pack-quantized weights load on little-endian hosts only")
    n, k = (int(v) for v in parts["shape"].tolist())
    if k % 2 and fmt.method == "int4":
        raise ValueError(f"checkpoint: {base} has an odd input width {k}; int4 weights need an even one")
    stored = parts["packed"].contiguous().view(torch.uint8)
    if fmt.method == "int8":  # one byte per value, offset by 128
        qdata = (stored[:, :k].to(torch.int16) - 128).to(torch.int8)
        return QuantParts(qdata.contiguous(), parts["scale"].reshape(n, 1), None), (n, k)
    qdata = stored[:, : k // 2]  # [N, K / 2]
    scale = parts["scale"]
    zero = None
    if not fmt.symmetric:
        packed_zero = parts["zero_point"].transpose(0, 1).contiguous()  # [G, ceil(N / 8)], packed along N
        zero = nibbles_of_int32(packed_zero)[:, :n].transpose(0, 1).to(scale.dtype).contiguous()  # [N, G]
    return QuantParts(qdata.contiguous(), scale, zero), (n, k)
