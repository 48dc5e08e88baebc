"""Building a model without paying for it twice: construct on the meta device, let tensor parallelism shrink the
layers (`apply_tp`), then allocate each parameter once where it will live: the device, except routed experts
under expert offload, which live in host memory (page-locked when the device is a GPU, for fast copies).

Also the `dummy` load format (vLLM's name): seeded random weights generated where they live, for benchmarks of
shapes no checkpoint on disk exists for. Knows nothing of checkpoints or requests.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from diffuserve.model.layers.moe.layer import FusedExperts
from diffuserve.model.quant.apply import fill_dummy_, quant_weights


@runtime_checkable
class HasTables(Protocol):
    """A module with derived buffers (e.g. a rotary embedding's cos / sin tables) rebuilt on its device."""

    def reset_tables(self, device: torch.device | str) -> None: ...


logger = logging.getLogger(__name__)
DUMMY_STD = 0.02
"""Standard deviation of dummy weights (norm weights are 1 + that)."""


def materialize(model: nn.Module, device: torch.device, expert_device: torch.device | None = None) -> None:
    """Allocates every (meta) parameter on `device`, routed experts on `expert_device` if given; recomputes the
    rotary tables there. Parameters keep their shard tags and sharing (tied LM heads); values are uninitialised."""
    pin = expert_device is not None and expert_device.type == "cpu" and device.type == "cuda"
    # id(meta parameter) -> (it, its allocation): tied parameters stay tied; holding it keeps the id unique.
    done: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
    for module in model.modules():
        is_expert = isinstance(module, FusedExperts) and expert_device is not None
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in done:
                target = expert_device if is_expert else device
                data = torch.empty(param.shape, dtype=param.dtype, device=target)
                if pin and is_expert:
                    pin_host_memory(data)
                new = nn.Parameter(data, requires_grad=param.requires_grad)
                new.__dict__.update(param.__dict__)  # the shard tag (see layers/linear)
                done[id(param)] = (param, new)
            setattr(module, name, done[id(param)][1])
        if isinstance(module, HasTables):
            module.reset_tables(device)


_PINNED: set[int] = set()
"""Host addresses this process page-locked (`pin_host_memory`), until `unpin_host_memory` releases them."""


def unpin_host_memory(model: nn.Module) -> None:
    """Releases the page locks `materialize` took on the model's host-resident experts (at engine shutdown: host
    memory freed while still registered would stay locked)."""
    if not _PINNED:
        return
    for param in model.parameters():
        pointer = param.data_ptr()
        if pointer in _PINNED:
            torch.cuda.cudart().cudaHostUnregister(pointer)
            _PINNED.discard(pointer)


def pin_host_memory(tensor: torch.Tensor) -> None:
    """Page-locks a host tensor in place (cudaHostRegister), so host -> device copies from it are asynchronous.
    Not `pin_memory=True`: PyTorch's pinned allocator rounds every block up to a power of two, which for a 35B
    model's experts would ask for nearly twice their size. Left pageable (a warning) if the driver refuses."""
    nbytes = tensor.numel() * tensor.element_size()
    register = getattr(torch.cuda.cudart(), "cudaHostRegister", None)
    error = int(register(tensor.data_ptr(), nbytes, 0)) if register is not None else -1  # 0 = cudaSuccess
    if error == 0:
        _PINNED.add(tensor.data_ptr())
    if error != 0:
        logger.warning(
            "could not pin %d MiB of expert weights (CUDA error %s); copies will be slower", nbytes >> 20, error
        )


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Fills every parameter with normal(0, DUMMY_STD) (norms 1 + that) in chunks, without a full-size temporary
    (quantized weights: such values, quantized chunk by chunk).
    Host-resident parameters (offloaded experts) are generated on the GPU when there is one and copied over: a
    35B model's experts fill in seconds instead of minutes."""
    maker = torch.device("cuda") if torch.cuda.is_available() else None
    quantized = {f"{name}.{p}" for name, w in quant_weights(model).items() for p, _ in w.named_parameters()}
    fill_dummy_(model, seed, DUMMY_STD)
    for index, (name, param) in enumerate(model.named_parameters()):
        if name in quantized:
            continue
        device = maker if param.device.type == "cpu" and maker is not None else param.device
        generator = torch.Generator(device=device).manual_seed(seed + index)
        for chunk in param.data.view(-1).split(1 << 26):
            values = torch.empty(chunk.shape, dtype=chunk.dtype, device=device)
            chunk.copy_(values.normal_(0.0, DUMMY_STD, generator=generator))
        if name.endswith("norm.weight"):
            param.data.add_(1.0)
