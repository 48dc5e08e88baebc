"""A PEFT LoRA adapter directory's `adapter_config.json`, read and checked. Owns which adapter forms the engine
runs: plain LoRA (`peft_type: LORA`) on linear layers, any rank up to `--max-lora-rank`, scaled by
`lora_alpha / r` (or rsLoRA's `lora_alpha / sqrt(r)`), per module where `rank_pattern` / `alpha_pattern` name it
(PEFT's rule: a key matches a module whose name ends with it as a regex); every other form is refused with one
line naming the field and the fix. Knows nothing of the model or of the weights (adapter_weights.py maps those).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"

_REFUSED: dict[str, str] = {
    "use_dora": "DoRA adapters are not supported; merge it into the weights (merge_and_unload) or train plain LoRA",
    "modules_to_save": "fully trained modules are not supported; merge the adapter (merge_and_unload) and serve "
    "the merged checkpoint",
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
    """r: the rank of a module's A [r, in] and B [out, r] unless `rank_pattern` names the module."""
    alpha: float
    rslora: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)

    def rank_of(self, module: str) -> int:
        key = _pattern_key(self.rank_pattern, module)
        return self.rank if key is None else int(self.rank_pattern[key])

    def scaling(self, module: str) -> float:
        """What B @ A of `module` (its Hugging Face name) is multiplied by: alpha / r, or alpha / sqrt(r) with
        use_rslora."""
        rank = self.rank_of(module)
        key = _pattern_key(self.alpha_pattern, module)
        alpha = self.alpha if key is None else float(self.alpha_pattern[key])
        return alpha / math.sqrt(rank) if self.rslora else alpha / rank


def _pattern_key(patterns: Mapping[str, object], module: str) -> str | None:
    """The first pattern key matching `module` as PEFT matches them (the module name ends with the regex)."""
    return next((key for key in patterns if re.match(rf"(.*\.)?({key})$", module)), None)


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
    for key, why in _REFUSED.items():
        if raw.get(key):
            raise AdapterError(f"adapter {name!r}: {key} {raw[key]!r}: {why}")
    rank, alpha = raw.get("r"), raw.get("lora_alpha", 8)
    rank_pattern, alpha_pattern = raw.get("rank_pattern") or {}, raw.get("alpha_pattern") or {}
    for value in (rank, *rank_pattern.values()):
        if not isinstance(value, int) or value < 1:
            raise AdapterError(f"adapter {name!r}: r must be a positive integer, got {value!r}")
        if value > max_rank:
            raise AdapterError(
                f"adapter {name!r}: rank r={value} is above max_lora_rank {max_rank}; restart with "
                f"--max-lora-rank {value}"
            )
    for value in (alpha, *alpha_pattern.values()):
        if not isinstance(value, (int, float)):
            raise AdapterError(f"adapter {name!r}: lora_alpha must be a number, got {value!r}")
    assert isinstance(rank, int), "checked above"
    return AdapterConfig(rank, float(alpha), bool(raw.get("use_rslora")), rank_pattern, alpha_pattern)
