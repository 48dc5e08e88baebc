"""A worker rank: builds its part of the model (the same way rank 0 does), then runs every forward rank 0
broadcasts until told to stop. Never schedules, samples or decodes: rank 0 alone owns requests and reads the
logits (the hidden states are identical on every rank after the last all-reduce).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection

import torch

from diffuserve.config import EngineConfig
from diffuserve.distributed.group import ParallelGroup, destroy_group, init_group, launched_by_torchrun
from diffuserve.distributed.step_channel import StepChannel

PR_SET_PDEATHSIG = 1


def worker_main(config: EngineConfig, rank: int, size: int, init_method: str, num_threads: int,
                conn: Connection) -> None:
    """Entry point of a spawned worker process (rank >= 1)."""
    _die_with_parent()
    torch.set_num_threads(num_threads)
    try:
        conn.send("started")
        device = worker_device(config, rank)
        group = init_group(rank, size, config.parallel.enable_expert_parallel, device, init_method)
        run_worker(config, group, device)
    except Exception:  # reported to rank 0, which fails the engine's start (or step) with it
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        destroy_group()


def run_if_torchrun_worker(config: EngineConfig) -> bool:
    """Under torchrun, a rank >= 1 serves rank 0's forwards until told to stop and returns True; rank 0 (and a
    process torchrun did not start) returns False at once and goes on to build the engine."""
    if not launched_by_torchrun() or int(os.environ["RANK"]) == 0:
        return False
    size = int(os.environ["WORLD_SIZE"])
    if size != config.parallel.tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size: {config.parallel.tensor_parallel_size} differs from torchrun's {size} processes; "
            f"pass --tensor-parallel-size {size}"
        )
    run_torchrun_worker(config, int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")))
    return True


def run_torchrun_worker(config: EngineConfig, rank: int, local_rank: int) -> None:
    """A rank >= 1 that torchrun started: joins the group through the environment and serves forwards."""
    device = worker_device(config, local_rank)
    group = init_group(rank, config.parallel.tensor_parallel_size, config.parallel.enable_expert_parallel, device)
    try:
        run_worker(config, group, device)
    finally:
        destroy_group()


def run_worker(config: EngineConfig, group: ParallelGroup, device: torch.device) -> None:
    from diffuserve.engine.engine_setup import build_shard, resolve_model

    _, args, max_model_len = resolve_model(config)
    shard = build_shard(config, args, max_model_len, group, device)
    channel = StepChannel(group)
    with torch.inference_mode():
        while (inputs := channel.receive()) is not None:
            shard.forward(inputs.to(device))


def worker_device(config: EngineConfig, local_rank: int) -> torch.device:
    """Rank r's device: cuda:r on GPU machines (one GPU per rank), else the CPU."""
    wants_cuda = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    return torch.device(f"cuda:{local_rank}") if wants_cuda else torch.device("cpu")


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies, even if the parent is killed (no orphans)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
