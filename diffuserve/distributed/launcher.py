"""Starts and stops the worker ranks of one engine: either local processes it spawns itself (ranks 1..size-1;
rank 0 is the engine's own process) that meet through a fresh rendezvous file, never a fixed port, or the ranks
torchrun started (several nodes). Owns the processes, their error reports and a clean shutdown; knows nothing of
models (the workers build their own, see worker).

Shutdown: rank 0 broadcasts "stop", the workers leave their loop and exit; any still alive after a timeout are
terminated, then killed. Workers also die with their parent (Linux parent-death signal), so none is orphaned.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import torch

from diffuserve.config import EngineConfig
from diffuserve.distributed.group import SINGLE, ParallelGroup, destroy_group, init_group, launched_by_torchrun
from diffuserve.distributed.step_channel import StepChannel
from diffuserve.distributed.worker import worker_main

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0


@dataclass
class ParallelRuntime:
    """Rank 0's view of the parallel run: its group, the channel to the workers, local worker processes."""

    group: ParallelGroup = SINGLE
    channel: StepChannel | None = None
    processes: list[mp.process.BaseProcess] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    rendezvous_dir: str | None = None
    closed: bool = False

    def worker_error(self) -> str | None:
        """The first error a local worker reported (its traceback), if any."""
        for rank, conn in enumerate(self.connections, start=1):
            while conn.poll():
                message = conn.recv()
                if isinstance(message, tuple) and message[0] == "error":
                    return f"worker rank {rank} failed:\n{message[1]}"
        return None

    def close(self) -> None:
        """Stops the workers (idempotent; also run at interpreter exit)."""
        if self.closed:
            return
        self.closed = True
        if self.channel is not None and all(p.is_alive() for p in self.processes):
            try:
                self.channel.send(None)
            except RuntimeError as e:  # a worker already gone: terminate the rest below
                logger.warning("could not tell the workers to stop: %s", e)
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        destroy_group()
        if self.rendezvous_dir is not None:
            shutil.rmtree(self.rendezvous_dir, ignore_errors=True)


def start_parallel(config: EngineConfig, device: torch.device) -> ParallelRuntime:
    """Rank 0: joins (torchrun) or starts (local processes) the engine's ranks; a no-op for one process."""
    parallel = config.parallel
    size = parallel.tensor_parallel_size
    if size == 1:
        return ParallelRuntime()
    if launched_by_torchrun():
        if int(os.environ["RANK"]) != 0:
            raise ValueError("torchrun rank > 0: call diffuserve.distributed.worker.run_if_torchrun_worker(config) "
                             "before building an engine (`diffuserve serve` does)")
        if int(os.environ["WORLD_SIZE"]) != size:
            raise ValueError(f"tensor_parallel_size: {size} differs from torchrun's {os.environ['WORLD_SIZE']} "
                             f"processes; pass --tensor-parallel-size {os.environ['WORLD_SIZE']}")
        group = init_group(0, size, parallel.enable_expert_parallel, device)
        runtime = ParallelRuntime(group, StepChannel(group))
    else:
        runtime = _spawn_workers(config, size)
        _wait_started(runtime)
        init_method = f"file://{runtime.rendezvous_dir}/store"
        runtime.group = init_group(0, size, parallel.enable_expert_parallel, device, init_method)
        runtime.channel = StepChannel(runtime.group)
    atexit.register(runtime.close)
    return runtime


def _spawn_workers(config: EngineConfig, size: int) -> ParallelRuntime:
    runtime = ParallelRuntime(rendezvous_dir=tempfile.mkdtemp(prefix="diffuserve-rendezvous-"))
    init_method = f"file://{runtime.rendezvous_dir}/store"
    context = mp.get_context("spawn")  # never fork a process that may hold CUDA or OpenMP state
    for rank in range(1, size):
        parent, child = context.Pipe()
        process = context.Process(
            target=worker_main, args=(config, rank, size, init_method, torch.get_num_threads(), child),
            name=f"diffuserve-rank{rank}", daemon=True,
        )
        process.start()
        child.close()
        runtime.processes.append(process)
        runtime.connections.append(parent)
    return runtime


def _wait_started(runtime: ParallelRuntime) -> None:
    """Waits until every worker is about to join the group, so that a worker that dies while starting fails
    the engine's start with its error instead of leaving rank 0 waiting for the rendezvous."""
    for rank, (process, conn) in enumerate(zip(runtime.processes, runtime.connections), start=1):
        if conn.poll(START_TIMEOUT_S) and conn.recv() == "started":
            continue
        error = runtime.worker_error() or f"worker rank {rank} did not start (exit code {process.exitcode})"
        runtime.close()
        raise RuntimeError(error)
