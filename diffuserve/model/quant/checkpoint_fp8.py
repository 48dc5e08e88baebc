"""The Qwen / DeepSeek FP8 checkpoint format (`quantization_config.quant_method: fp8`, transformers'
"fine-grained FP8"): each quantized weight is stored as float8_e4m3fn beside `<name>_scale_inv`, the fp32
*dequantization* multiplier (despite its name) of each `weight_block_size` block:

    model.layers.0.self_attn.q_proj.weight            fp8  [N, K]
    model.layers.0.self_attn.q_proj.weight_scale_inv  fp32 [ceil(N / bn), ceil(K / bk)]      W = q * scale_inv
    model.layers.0.mlp.experts.gate_up_proj            fp8  [E, 2I, H]   (fused experts, transformers 5 names)
    model.layers.0.mlp.experts.gate_up_proj_scale_inv  fp32 [E, ceil(2I / bn), ceil(H / bk)]

Without `weight_block_size` the scale is one number per tensor, stored here as one per output channel (exact).
Only e4m3 with dynamic activation scales is supported; other settings are one-line errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from diffuserve.model.quant.checkpoint_base import CheckpointQuant
from diffuserve.model.quant.formats import QuantFormat, QuantParts

SCALE_SUFFIX = "_scale_inv"


class Fp8Checkpoint(CheckpointQuant):
    base_holds_values = True

    def __init__(self, config: dict[str, Any], names: Iterable[str]) -> None:
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"quantization_config.fmt: {fmt!r} is not supported; only e4m3 fp8 checkpoints load")
        scheme = config.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ValueError(
                f"quantization_config.activation_scheme: {scheme!r} is not supported; only dynamic (weights-only "
                "scales) fp8 checkpoints load"
            )
        block = config.get("weight_block_size")
        if block is not None and (len(block) != 2 or min(block) < 1):
            raise ValueError(f"quantization_config.weight_block_size: {block!r} must be [rows, columns]")
        self.format = QuantFormat("fp8", block[1], block[0]) if block else QuantFormat("fp8")
        self.label = f"fp8 ({f'{block[0]} x {block[1]} blocks' if block else 'one scale per tensor'})"
        super().__init__(names)

    def split(self, name: str) -> tuple[str, str] | None:
        return (name[: -len(SCALE_SUFFIX)], "scale") if name.endswith(SCALE_SUFFIX) else None

    def format_for(self, base: str) -> QuantFormat:
        return self.format

    def decode(self, base: str, parts: dict[str, torch.Tensor]) -> tuple[QuantParts, tuple[int, ...]]:
        qdata, scale = parts["qdata"], parts["scale"].float()
        if qdata.dtype != torch.float8_e4m3fn:
            raise ValueError(f"checkpoint: {base} is {qdata.dtype}, expected float8_e4m3fn beside its {SCALE_SUFFIX}")
        if self.format.group_size is None:  # one scale per tensor (per expert) -> one per row, the same value
            lead = qdata.shape[:-2]
            scale = scale.reshape(*lead, 1, 1).expand(*qdata.shape[:-1], 1).contiguous()
        return QuantParts(qdata, scale, None), tuple(qdata.shape)
