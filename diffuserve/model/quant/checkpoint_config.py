"""A checkpoint's own quantization: `config.json`'s `quantization_config` -> the format reader of its tensors
(checkpoint_fp8, checkpoint_gptq_awq, checkpoint_ct), built from the config and the tensor names alone (the
safetensors headers), before any weight is read. A method we do not read is a one-line error naming it, never a
silent 16-bit load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import safe_open

from diffuserve.model.quant.checkpoint_base import CheckpointQuant
from diffuserve.model.quant.checkpoint_ct import CompressedTensorsCheckpoint
from diffuserve.model.quant.checkpoint_fp8 import Fp8Checkpoint
from diffuserve.model.quant.checkpoint_gptq_awq import GptqAwqCheckpoint

READERS: dict[str, Callable[[dict[str, Any], list[str]], CheckpointQuant]] = {
    "fp8": Fp8Checkpoint,
    "gptq": GptqAwqCheckpoint,
    "awq": GptqAwqCheckpoint,
    "compressed-tensors": CompressedTensorsCheckpoint,
}


def tensor_names(model_dir: str | Path) -> list[str]:
    """Every tensor name of a directory's safetensors files (headers only)."""
    names: list[str] = []
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def checkpoint_quant(config: dict[str, Any], model_dir: str | Path) -> CheckpointQuant | None:
    """The reader of the checkpoint's quantized tensors, None for a 16/32-bit checkpoint."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method not in READERS:
        raise ValueError(
            f"quantization_config.quant_method: {method!r} is not supported; supported checkpoint formats: "
            f"{', '.join(READERS)} (or a 16-bit checkpoint with --quantization)"
        )
    reader = READERS[method]({**quant, "quant_method": method}, tensor_names(model_dir))
    if not reader.roles:
        raise ValueError(
            f"quantization_config.quant_method: {method}, but {str(model_dir)!r} holds no quantized tensors "
            "(no *_scale_inv / qweight / weight_packed / weight_scale); fix config.json"
        )
    return reader
