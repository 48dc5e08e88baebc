"""A PEFT LoRA adapter directory's `adapter_config.json`, read and checked. Owns which adapter forms the engine
runs: plain LoRA (`peft_type: LORA`) on linear layers, any rank up to `--max-lora-rank`, scaled by
`lora_alpha / r` (or rsLoRA's `lora_alpha / sqrt(r)`); every other form is refused with one line naming the field
and the fix. Knows nothing of the model or of the weights (adapter_weights.py maps those).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"

_REFUSED: dict[str, str] = {
    "use_dora": "DoRA adapters are not supported; merge it into the weights (merge_and_unload) or train plain LoRA",
    "modules_to_save": "fully trained modules are not supported; merge the adapter (merge_and_unload) and serve "
    "the merged checkpoint",
    "rank_pattern": "per-module ranks are not supported; train with one r for every module",
    "alpha_pattern": "per-module alphas are not supported; train with one lora_alpha for every module",
    "lora_bias": "trained LoRA biases are not supported; train with lora_bias=False",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers) is not supported; the engine's layers are nn.Linear",
    "target_parameters": "adapters on parameters (e.g. fused routed experts) are not supported; target linear "
    "modules only",
    "trainable_token_indices": "trained token embeddings are not supported; merge the adapter and serve the merge",
    "layer_replication": "layer replication is not supported; merge the adapter and serve the merged checkpoint",
}
"""Fields that must be empty / false, and why (with the fix)."""


class AdapterError(ValueError):
    """An adapter the engine cannot load as given; the message names the adapter, the field and the fix."""


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    """r: the rank of every module's A [r, in] and B [out, r]."""
    scaling: float
    """What B @ A is multiplied by: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora."""


def read_adapter_config(path: Path, name: str, max_rank: int) -> AdapterConfig:
    """The checked config of the adapter directory `path` (served as `name`); AdapterError if it cannot be run."""
    if not path.is_dir():
        raise AdapterError(f"lora_path: {str(path)!r} (adapter {name!r}) is not a directory; pass a PEFT adapter dir")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / file).is_file():
            hint = " (convert adapter_model.bin with safetensors)" if file == WEIGHTS_FILE else ""
            raise AdapterError(f"lora_path: {str(path)!r} (adapter {name!r}) has no {file}{hint}")
    try:
        raw = json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise AdapterError(f"lora_path: {str(path / CONFIG_FILE)!r} is not valid JSON ({e})") from None
    return check_adapter_config(raw, name, max_rank)


def check_adapter_config(raw: dict[str, Any], name: str, max_rank: int) -> AdapterConfig:
    """AdapterConfig of a parsed adapter_config.json; AdapterError naming the first field the engine refuses."""
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type {raw['peft_type']!r} is not supported; only LORA is")
    if raw.get("bias", "none") != "none":
        raise AdapterError(f"adapter {name!r}: bias {raw['bias']!r} is not supported; train with bias='none'")
    for field, why in _REFUSED.items():
        if raw.get(field):
            raise AdapterError(f"adapter {name!r}: {field} {raw[field]!r}: {why}")
    rank, alpha = raw.get("r"), raw.get("lora_alpha", 8)
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {name!r}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(
            f"adapter {name!r}: rank r={rank} is above max_lora_rank {max_rank}; restart with --max-lora-rank {rank}"
        )
    if not isinstance(alpha, (int, float)):
        raise AdapterError(f"adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    return AdapterConfig(rank, scaling)
