"""Which attention backend a model's paged attention layers run (`--attention-backend`):

  - auto: flashinfer where it can run (a CUDA device, the package importable, a float16 / bfloat16 model),
    batched otherwise;
  - loop: the per-sequence reference; batched: the padded SDPA groups, on any device;
  - flashinfer: FlashInfer's varlen paged kernel, a one-line error where it cannot run.

`set_attention_backend` installs the choice on every paged attention layer of a model (the engine calls it once
per rank after loading); a layer never given one runs batched.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.flashinfer import FlashInferBackend
from diffuserve.model.layers.attention_backends.interface import AttentionBackend
from diffuserve.model.layers.attention_backends.loop import LoopBackend

BACKENDS = ("auto", "loop", "batched", "flashinfer")


@runtime_checkable
class UsesAttentionBackend(Protocol):
    """A paged attention layer of any family: whatever computes its attention is its `attention_backend`."""

    attention_backend: AttentionBackend


INSTALL_HINT = "pip install 'diffuserve[cuda-kernels]'"
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


def is_cuda(device: torch.device) -> bool:
    """The device check of `select` (tests replace it to run the FlashInfer adapter on its contract double)."""
    return device.type == "cuda"


def select(name: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """The backend `name` gives a model of `dtype` on `device` (see the module docstring); a one-line ValueError
    for an unknown name and for flashinfer where it cannot run."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend: {name!r} is not one of {', '.join(BACKENDS)}; pick one of those")
    if name == "loop":
        return LoopBackend()
    if name == "batched":
        return BatchedBackend()
    flashinfer = _import_flashinfer(device, dtype)
    if not isinstance(flashinfer, str):
        return FlashInferBackend(flashinfer)
    if name == "flashinfer":
        raise ValueError(f"attention_backend: flashinfer {flashinfer}; use --attention-backend auto or batched")
    return BatchedBackend()


def _import_flashinfer(device: torch.device, dtype: torch.dtype) -> object | str:
    """The flashinfer package, or why it cannot run this model."""
    if not is_cuda(device):
        return f"needs a CUDA device, the model is on {device}"
    if dtype not in FLASHINFER_DTYPES:
        return f"computes in float16 or bfloat16, the model is {str(dtype).removeprefix('torch.')}"
    try:
        module = importlib.import_module("flashinfer")
        module.BatchPrefillWithPagedKVCacheWrapper  # noqa: B018 - the one class the adapter calls
    except (ImportError, AttributeError) as error:
        return f"does not import ({type(error).__name__}: {error}); {INSTALL_HINT}"
    return module


def set_attention_backend(model: nn.Module, name: str, device: torch.device) -> None:
    """Every paged attention layer of `model` (on `device`) runs `name` (BACKENDS); raises as `select` does."""
    layers = [m for m in model.modules() if isinstance(m, UsesAttentionBackend)]
    dtype = next(model.parameters()).dtype
    backend = select(name, device, dtype)
    for layer in layers:
        layer.attention_backend = backend
