"""diffuserve: serve block-diffusion Mixture-of-Experts language models, exactly and fast.

The public names load lazily, so that torch-free parts (`diffuserve.planner`, the CLI's help) never import torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diffuserve.config import EngineConfig
    from diffuserve.llm import LLM
    from diffuserve.lora_request import LoRARequest
    from diffuserve.sampling_params import RequestOutputKind, SamplingParams

try:  # the installed distribution's version: pyproject.toml's `version` is the one source
    __version__ = importlib.metadata.version("diffuserve")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
__all__ = ["LLM", "EngineConfig", "LoRARequest", "RequestOutputKind", "SamplingParams", "__version__"]

_LAZY = {
    "LLM": "diffuserve.llm",
    "EngineConfig": "diffuserve.config",
    "LoRARequest": "diffuserve.lora_request",
    "SamplingParams": "diffuserve.sampling_params",
    "RequestOutputKind": "diffuserve.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'diffuserve' has no attribute {name!r}")
