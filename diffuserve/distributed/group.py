"""ParallelGroup: the ranks that share one model (tensor and expert parallelism) and the collectives the model
layers call. Owns process-group setup and teardown; knows nothing of requests or of the model's shapes.

Two process groups are used: the default one for tensors inside a forward (NCCL on GPUs, gloo on CPU) and a
gloo group for the step metadata rank 0 broadcasts (Python objects on the host), whose long timeout lets worker
ranks wait while rank 0 is idle between requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""Rendezvous and collectives inside a forward; a peer that is gone fails the step after this."""
IDLE_TIMEOUT = timedelta(days=30)
"""How long a worker may wait for rank 0's next step (a server can be idle for a long time)."""


@dataclass(frozen=True)
class ParallelGroup:
    rank: int
    size: int
    expert_parallel: bool
    """Experts are split whole across the ranks (E / size each) instead of each expert's width."""
    control_group: dist.ProcessGroup | None = None
    """gloo group for step metadata (None when size == 1)."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over the ranks; returns `tensor`."""
        if self.size > 1:
            dist.all_reduce(tensor)
        return tensor


SINGLE = ParallelGroup(rank=0, size=1, expert_parallel=False)


def launched_by_torchrun() -> bool:
    """True when torchrun (or another env:// launcher) started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def torchrun_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun set them; only under `launched_by_torchrun()`."""
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device_type: str, local_rank: int) -> torch.device:
    """A rank's device: cuda:local_rank on GPU machines (one GPU per rank), else the CPU."""
    return torch.device(f"cuda:{local_rank}") if device_type == "cuda" else torch.device("cpu")


def init_group(
    rank: int, size: int, expert_parallel: bool, device: torch.device, init_method: str = "env://"
) -> ParallelGroup:
    """Joins the process group (every rank calls this with the same size and init_method)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return ParallelGroup(rank, size, expert_parallel, control)


def agree_min(group: ParallelGroup, value: int) -> int:
    """The smallest `value` over the ranks (e.g. KV pages: every rank must hold the same number)."""
    if group.size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group.control_group)
    return int(tensor.item())


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
