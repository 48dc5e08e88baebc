"""The process of a worker rank (rank >= 1): set up the process, join the group, then run the target its caller
built until it returns (the engine's target builds the rank's executor and serves rank 0's forwards). Knows
process groups only, never models or the engine. A spawned worker reports its target's exception to rank 0 over
its pipe before exiting, so rank 0 can fail with the worker's traceback instead of a broken collective.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

from diffuserve.distributed.group import ParallelGroup, destroy_group, init_group, rank_device, torchrun_rank

PR_SET_PDEATHSIG = 1
WorkerTarget = Callable[[ParallelGroup, torch.device], None]
"""What a worker rank runs once it joined the group: (its group, its device) -> None when told to stop. Spawned
workers receive it pickled, so it must be importable (a module-level function, or a partial of one)."""


def worker_main(
    target: WorkerTarget,
    rank: int,
    size: int,
    expert_parallel: bool,
    init_method: str,
    device: torch.device,
    num_threads: int,
    conn: Connection,
) -> None:
    """Entry point of a spawned worker process (rank >= 1)."""
    _die_with_parent()
    torch.set_num_threads(num_threads)
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # a missing GPU fails here, before rank 0 waits at the rendezvous
        conn.send("started")
        group = init_group(rank, size, expert_parallel, device, init_method)
        target(group, device)
    except Exception:  # reported to rank 0, which fails the engine's start (or step) with it
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        destroy_group()


def run_torchrun_worker(target: WorkerTarget, expert_parallel: bool, device_type: str) -> None:
    """A rank >= 1 that torchrun started: joins the group through the environment and runs `target`."""
    rank, size, local_rank = torchrun_rank()
    device = rank_device(device_type, local_rank)
    group = init_group(rank, size, expert_parallel, device)
    try:
        target(group, device)
    finally:
        destroy_group()


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies, even if the parent is killed (no orphans)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
