"""`diffuserve quantize SRC DST --quantization ...`: a compressed-tensors checkpoint from a 16/32-bit one, so users
quantize once (and vLLM reads the result too). Shard by shard: one source shard in memory at a time, each
quantized weight in chunks of rows (quantize.py, the same rules as quantizing on load, so loading DST gives the
very values `--quantization` gives on SRC).

    int4  pack-quantized, 4-bit groups, asymmetric:  X.weight_packed, X.weight_scale, X.weight_zero_point,
                                                     X.weight_shape
    int8  pack-quantized, 8-bit channel, symmetric:  X.weight_packed, X.weight_scale, X.weight_shape
    fp8   float-quantized, channel:                  X.weight (float8_e4m3fn), X.weight_scale (fp32)

Fused expert tensors (`mlp.experts.gate_up_proj` [E, 2I, H]) are written per expert, under the Hub's names.
Knows nothing of the engine.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from diffuserve.model.family import ModelFamily
from diffuserve.model.loader import load_args, read_model_config
from diffuserve.model.quant.apply import check_width
from diffuserve.model.quant.checkpoint_base import pack_nibbles
from diffuserve.model.quant.formats import QuantFormat, QuantParts
from diffuserve.model.quant.quantize import on_load_format, quantize
from diffuserve.model.quant.scheme import QuantScheme
from diffuserve.model.quant.weight import CHUNK_ELEMENTS

INDEX = "model.safetensors.index.json"


def _quantized(w: torch.Tensor, fmt: QuantFormat) -> QuantParts:
    """w [N, K] quantized in chunks of rows (the same values as on load)."""
    step = max(1, CHUNK_ELEMENTS // w.shape[-1])
    chunks = [quantize(w[i : i + step], fmt, w.dtype) for i in range(0, w.shape[0], step)]
    zero = None if chunks[0].zero is None else torch.cat([c.zero for c in chunks if c.zero is not None])
    return QuantParts(torch.cat([c.qdata for c in chunks]), torch.cat([c.scale for c in chunks]), zero)


def _as_int32(data: torch.Tensor) -> torch.Tensor:
    """uint8 [R, B] -> int32 [R, ceil(B / 4)] (little-endian words, zero-padded)."""
    padded = F.pad(data, (0, -data.shape[1] % 4)).contiguous()
    return padded.reshape(-1).view(torch.int32).reshape(data.shape[0], -1)  # flat first: a [1, B] may keep odd strides


def ct_tensors(module: str, w: torch.Tensor, fmt: QuantFormat) -> dict[str, torch.Tensor]:
    """One weight [N, K] as compressed-tensors stores it under module name `module`."""
    n, k = w.shape
    parts = _quantized(w, fmt)
    if fmt.method == "fp8":
        return {f"{module}.weight": parts.qdata, f"{module}.weight_scale": parts.scale}
    shape = torch.tensor([n, k], dtype=torch.int64)
    if fmt.method == "int8":
        stored = (parts.qdata.to(torch.int16) + 128).to(torch.uint8)
        packed = {f"{module}.weight_packed": _as_int32(stored), f"{module}.weight_scale": parts.scale}
        return {**packed, f"{module}.weight_shape": shape}
    out = {f"{module}.weight_packed": _as_int32(parts.qdata), f"{module}.weight_scale": parts.scale}
    assert parts.zero is not None, "on-load int4 is asymmetric"
    zero = parts.zero.to(torch.uint8).transpose(0, 1)  # [G, N], values zp + 8 (0..15)
    zero = pack_nibbles(F.pad(zero, (0, -n % 8)))  # [G, ceil(N / 8) * 4]
    out[f"{module}.weight_zero_point"] = _as_int32(zero).transpose(0, 1).contiguous()  # [ceil(N / 8), G]
    return {**out, f"{module}.weight_shape": shape}


def ct_config(fmt: QuantFormat, ignore: list[str]) -> dict[str, Any]:
    """The `quantization_config` of a checkpoint written by `ct_tensors`."""
    if fmt.method == "fp8":
        weights: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
        form = "float-quantized"
    elif fmt.method == "int8":
        weights, form = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}, "pack-quantized"
    else:
        weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group"}
        weights, form = {**weights, "group_size": fmt.group_size}, "pack-quantized"
    group = {"targets": ["Linear"], "weights": {**weights, "dynamic": False}, "input_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": form,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {**group, "format": form}},
        "ignore": sorted(ignore),
    }


def _matrices(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(module name, [N, K]) of a checkpoint weight; fused experts split per expert (Hub names)."""
    if tensor.dim() == 2:
        yield name.removesuffix(".weight"), tensor
        return
    prefix, kind = name.rsplit(".", 1)  # ...mlp.experts, gate_up_proj | down_proj
    for e, matrix in enumerate(tensor):
        if kind == "down_proj":
            yield f"{prefix}.{e}.down_proj", matrix
        else:
            gate, up = matrix.chunk(2)
            yield f"{prefix}.{e}.gate_proj", gate
            yield f"{prefix}.{e}.up_proj", up


class _Converter:
    def __init__(self, family: ModelFamily, src: Path, scheme: QuantScheme) -> None:
        self.family, (_, self.args) = family, load_args(src)
        self.scheme = scheme
        assert scheme.method is not None, "quantize_checkpoint checks the method"
        self.fmt = on_load_format(scheme.method, scheme.group_size)
        self.ignore: list[str] = []

    def convert(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        target = self.family.weight_target(name, self.args)
        tied = self.args.tie_word_embeddings and name == "lm_head.weight"
        if target is None or tied or not tensor.is_floating_point() or not self.scheme.quantizes(target.param):
            if tensor.dim() == 2 and name.endswith(".weight") and "embed" not in name:
                self.ignore.append(name.removesuffix(".weight"))
            return {name: tensor}
        out = {}
        for module, matrix in _matrices(name, tensor):
            check_width(self.fmt, tuple(matrix.shape), module)
            out.update(ct_tensors(module, matrix.contiguous(), self.fmt))
        return out


def quantize_checkpoint(src: str | Path, dst: str | Path, scheme: QuantScheme) -> dict[str, Any]:
    """Writes DST; returns a summary (files, bytes before and after)."""
    src, dst = Path(src), Path(dst)
    config, _ = read_model_config(src)
    if config.get("quantization_config") or scheme.method is None:
        raise ValueError("quantize: SRC must be a 16/32-bit checkpoint and --quantization fp8, int8 or int4 given")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"quantize: DST {str(dst)!r} exists and is not empty; pass a new directory")
    family, _ = load_args(src)
    converter = _Converter(family, src, scheme)
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(p.name for p in src.glob("*.safetensors"))
    weight_map, before, after = {}, 0, 0
    for file in files:
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(src / file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                tensor = f.get_tensor(name)
                before += tensor.numel() * tensor.element_size()
                out.update(converter.convert(name, tensor))
        save_file(out, str(dst / file), metadata={"format": "pt"})
        after += sum(t.numel() * t.element_size() for t in out.values())
        weight_map.update(dict.fromkeys(out, file))
    for other in src.iterdir():
        if other.is_file() and other.suffix != ".safetensors" and other.name not in ("config.json", INDEX):
            shutil.copy2(other, dst / other.name)
    if (src / INDEX).is_file():
        (dst / INDEX).write_text(json.dumps({"metadata": {"total_size": after}, "weight_map": weight_map}, indent=2))
    config["quantization_config"] = ct_config(converter.fmt, converter.ignore)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return {"files": files, "bytes_before": before, "bytes_after": after, "format": converter.fmt.describe()}
