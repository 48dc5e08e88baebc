"""The loader's side of settings_check: a model directory's config.json keys and tensor names (safetensors
headers only) checked against what its family understands, and reported once per directory (or raised under
strict_config). Which tensors the model takes is read from the family's model built on the meta device, and only
when some tensor name looks like a diffusion setting. Knows nothing of requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from diffuserve.model.config import ModelArgs
from diffuserve.model.settings_check import is_setting_tensor, key_lines, report, tensor_lines

if TYPE_CHECKING:
    from diffuserve.model.family import ModelFamily

_REPORTED: dict[Path, set[str]] = {}
"""Lines already logged per model directory: one load reads its config more than once (engine, then each rank)."""


def tensor_names(model_dir: Path) -> list[str]:
    names: list[str] = []
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def _loaded_by(family: ModelFamily, args: ModelArgs) -> set[str]:
    with torch.device("meta"):
        model = family.model_cls(args, 1)
    return {name for name, _ in model.named_parameters()}


def check_settings(config: dict, model_dir: Path, family: ModelFamily, args: ModelArgs, strict: bool) -> None:
    """Logs (or, under `strict`, raises) what the family does not implement of `config` and the checkpoint."""
    candidates = [name for name in tensor_names(model_dir) if is_setting_tensor(name)]
    params = _loaded_by(family, args) if candidates else set()

    def is_loaded(name: str) -> bool:
        target = family.weight_target(name, args)
        return target is None or target.param in params  # None: a tensor the family skips by design

    lines = key_lines(config, family.settings) + tensor_lines(candidates, is_loaded, family.settings)
    report(lines, strict, _REPORTED.setdefault(model_dir.resolve(), set()))
