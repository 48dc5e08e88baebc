"""Live weight updates of a loaded model (RL rollouts between training steps): a checkpoint directory or a state
dict with Hub names, copied in place into the model's parameters through the loader's own name map and checks
(every weight present, shapes as built), so the model, its caches, its compiled forward and its LoRA adapters
stay as they are; and sleep / wake_up, which on a GPU move the weights to host memory and back. Knows nothing of
requests: the engine runs these only when none is in flight, and flushes the prefix cache.

Refused with one line: a quantized model (its weights were quantized once, at load) and several ranks (each
rank would have to load its part; only rank 0 runs this).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from diffuserve.config import EngineConfig
from diffuserve.model.loader import load_args, load_weights
from diffuserve.model.quant.apply import quant_weights
from diffuserve.worker.executor import ModelExecutor

WeightSource = str | Path | Mapping[str, torch.Tensor]
"""A checkpoint directory (Hugging Face layout, the served model's architecture and shapes), or its tensors by
Hub name."""


def update_weights(executor: ModelExecutor, config: EngineConfig, source: WeightSource) -> None:
    """Copies `source`'s weights into the model; ValueError naming what does not match (the model is then
    partly updated: load a matching checkpoint again)."""
    _check_supported(executor, "update_weights")
    family, args = load_args(config.model)
    if isinstance(source, Mapping):
        load_weights(executor.model, family, args, config.model, tensors=source.items())
        return
    path = Path(source)
    new_family, new_args = load_args(path)
    if new_family.name != family.name or new_args.architecture != args.architecture:
        raise ValueError(
            f"model_path: {str(path)!r} is a {new_args.architecture} checkpoint, the engine serves "
            f"{args.architecture}; pass a checkpoint of the served model"
        )
    load_weights(executor.model, family, args, path)


def sleep(executor: ModelExecutor, config: EngineConfig) -> None:
    """On a GPU: the weights move to host memory and their device memory is freed (the KV cache and the LoRA
    adapters stay); on a CPU: nothing (the weights already live in host memory)."""
    if executor.device.type != "cuda":
        return
    _check_supported(executor, "sleep")
    if executor.run_model.compiled:
        raise ValueError("sleep: the compiled forward's CUDA graphs hold the weights' addresses; use --enforce-eager")
    if executor.offload is not None:
        raise ValueError("sleep: the offloaded experts already live in host memory; drop --expert-offload")
    executor.model.to("cpu")
    torch.cuda.empty_cache()


def wake_up(executor: ModelExecutor) -> None:
    """Brings the weights back to the device after `sleep` (nothing on a CPU)."""
    if executor.device.type == "cuda":
        executor.model.to(executor.device)


def _check_supported(executor: ModelExecutor, what: str) -> None:
    if executor.runtime.group.size > 1:
        raise ValueError(f"{what}: not supported with several ranks yet; use --tensor-parallel-size 1")
    if quant_weights(executor.model):
        raise ValueError(f"{what}: not supported for quantized weights yet; serve a 16/32-bit checkpoint")
