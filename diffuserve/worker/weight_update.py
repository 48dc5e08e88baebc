"""Live weight updates of a loaded model (RL rollouts between training steps): a checkpoint directory or a state
dict with Hub names, copied in place into the model's parameters through the loader's own name map and checks
(every weight present, shapes as built), so the model, its caches, its compiled forward and its LoRA adapters
stay as they are; and sleep / wake_up, which on a GPU move the weights to host memory and back. Knows nothing of
requests: the engine runs these only when none is in flight, and flushes the prefix cache.

Under tensor or expert parallelism rank 0 checks the source, then sends every other rank the same update over the
step channel (`RankWeightUpdate`), and each rank copies its own part (the loader's slicing, as at load).

Refused with one line: a quantized model (its weights were quantized once, at load); sleep / wake_up above one
rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from diffuserve.config import EngineConfig
from diffuserve.model.loader import load_args, load_weights
from diffuserve.model.quant.apply import quant_weights
from diffuserve.worker.executor import ModelExecutor

WeightSource = str | Path | Mapping[str, torch.Tensor]
"""A checkpoint directory (Hugging Face layout, the served model's architecture and shapes), or its tensors by
Hub name."""


@dataclass(frozen=True)
class RankWeightUpdate:
    """A weight update as rank 0 sends it to the other ranks (a step-channel message: `run` on each rank)."""

    served_model: str
    """The served model's directory (its family and arguments)."""
    source: str | dict[str, torch.Tensor]
    """A checkpoint directory, or the tensors by Hub name (host tensors: the channel pickles them)."""

    def run(self, executor: ModelExecutor) -> None:
        """Copies this rank's part of the new weights into its model."""
        family, args = load_args(self.served_model)
        if isinstance(self.source, dict):
            load_weights(executor.model, family, args, self.served_model, tensors=self.source.items())
        else:
            load_weights(executor.model, family, args, self.source)


def update_weights(executor: ModelExecutor, config: EngineConfig, source: WeightSource) -> None:
    """Copies `source`'s weights into the model, on every rank; ValueError naming what does not match (the model
    is then partly updated: load a matching checkpoint again)."""
    if quant_weights(executor.model):
        raise ValueError("update_weights: not supported for quantized weights yet; serve a 16/32-bit checkpoint")
    if isinstance(source, Mapping):
        update = RankWeightUpdate(config.model, {name: t.detach().cpu() for name, t in source.items()})
    else:
        _check_same_model(config.model, Path(source))
        update = RankWeightUpdate(config.model, str(source))
    executor.run_on_every_rank(update)


def _check_same_model(served: str, path: Path) -> None:
    family, args = load_args(served)
    new_family, new_args = load_args(path)
    if new_family.name != family.name or new_args.architecture != args.architecture:
        raise ValueError(
            f"model_path: {str(path)!r} is a {new_args.architecture} checkpoint, the engine serves "
            f"{args.architecture}; pass a checkpoint of the served model"
        )


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
