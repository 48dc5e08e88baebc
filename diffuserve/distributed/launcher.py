"""Starts and stops the worker ranks of one engine: either local processes it spawns itself (ranks 1..size-1;
rank 0 is the engine's own process) that meet through a fresh rendezvous file, never a fixed port, or the ranks
torchrun started (several nodes). Owns the processes, their error reports and a clean shutdown; knows nothing of
models or the engine (a spawned worker runs the target rank 0's caller hands in, see worker).

Shutdown: rank 0 broadcasts "stop", the workers leave their loop and exit; any still alive after a timeout are
terminated, then killed. Workers also die with their parent (Linux parent-death signal), so none is orphaned.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import shutil
import tempfile
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import torch

from diffuserve.distributed.group import (
    SINGLE,
    ParallelGroup,
    destroy_group,
    init_group,
    launched_by_torchrun,
    rank_device,
)
from diffuserve.distributed.step_channel import StepChannel
from diffuserve.distributed.worker import WorkerTarget, worker_main

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
EXIT_GRACE_S = 1.0
"""How long a failure report waits for a worker whose connection broke to be seen as exited."""


@dataclass
class ParallelRuntime:
    """This rank's view of the parallel run: its group and the step channel; on rank 0 also the local worker
    processes it spawned (none under torchrun, whose ranks are not its children)."""

    group: ParallelGroup = SINGLE
    channel: StepChannel | None = None
    processes: list[mp.process.BaseProcess] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    rendezvous_dir: str | None = None
    closed: bool = False
    _error: str | None = None

    @property
    def init_method(self) -> str:
        return f"file://{self.rendezvous_dir}/store"

    def failure(self) -> str | None:
        """Why a local worker failed: the first error one reported (its traceback), else the first one that
        exited, else None. Reads the workers' pipes (waits up to EXIT_GRACE_S per live worker)."""
        for rank, conn in enumerate(self.connections, start=1):
            while not conn.closed and self._error is None and (message := _receive(conn, 0)) is not None:
                self._record(rank, message)
        if self._error is not None:
            return self._error
        for rank, process in enumerate(self.processes, start=1):
            process.join(EXIT_GRACE_S)
            if not process.is_alive():
                return f"worker rank {rank} exited with code {process.exitcode}"
        return None

    def lost_worker(self) -> str | None:
        """Without waiting: "worker rank r exited with code N" for the first local worker no longer alive (a worker
        that reported an error first: its traceback), else None. Cheap enough to poll while the engine idles."""
        return self.failure() if any(p.exitcode is not None for p in self.processes) else None

    def _record(self, rank: int, message: object) -> None:
        if self._error is None and isinstance(message, tuple) and message[0] == "error":
            self._error = f"worker rank {rank} failed:\n{message[1]}"

    def close(self) -> None:
        """Rank 0: stops the workers and destroys the process group (idempotent; also run at interpreter exit)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)  # nothing left to do at exit, and the runtime may be freed
        if self.channel is not None and self.group.rank == 0 and all(p.is_alive() for p in self.processes):
            try:
                self.channel.send(None)
            except (RuntimeError, ValueError) as e:  # a worker gone, or the group already destroyed: terminate below
                logger.warning("could not tell the workers to stop: %s", e)
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self.connections:
            conn.close()
        if self.group.size > 1:  # a one-process engine made no group: never destroy one its caller made
            destroy_group()
        if self.rendezvous_dir is not None:
            shutil.rmtree(self.rendezvous_dir, ignore_errors=True)


def start_parallel(size: int, expert_parallel: bool, device: torch.device, target: WorkerTarget) -> ParallelRuntime:
    """Rank 0 (on `device`): joins the ranks torchrun started, or spawns ranks 1..size-1, each running `target`
    on its own device once it joined the group. A no-op for one process."""
    if size == 1:
        return ParallelRuntime()
    if launched_by_torchrun():
        group = init_group(0, size, expert_parallel, device)
        runtime = ParallelRuntime(group, StepChannel(group))
    else:
        runtime = _spawn_workers(target, size, expert_parallel, device.type)
        _wait_started(runtime)
        runtime.group = init_group(0, size, expert_parallel, device, runtime.init_method)
        runtime.channel = StepChannel(runtime.group)
    atexit.register(runtime.close)
    return runtime


def _spawn_workers(target: WorkerTarget, size: int, expert_parallel: bool, device_type: str) -> ParallelRuntime:
    runtime = ParallelRuntime(rendezvous_dir=tempfile.mkdtemp(prefix="diffuserve-rendezvous-"))
    context = mp.get_context("spawn")  # never fork a process that may hold CUDA or OpenMP state
    for rank in range(1, size):
        parent, child = context.Pipe()
        args = (
            target,
            rank,
            size,
            expert_parallel,
            runtime.init_method,
            rank_device(device_type, rank),
            torch.get_num_threads(),
            child,
        )
        process = context.Process(target=worker_main, args=args, name=f"diffuserve-rank{rank}", daemon=True)
        process.start()
        child.close()
        runtime.processes.append(process)
        runtime.connections.append(parent)
    return runtime


def _wait_started(runtime: ParallelRuntime) -> None:
    """Waits until every worker is about to join the group, so that a worker that dies while starting fails
    the engine's start with its error instead of leaving rank 0 waiting for the rendezvous."""
    for rank, (process, conn) in enumerate(zip(runtime.processes, runtime.connections), start=1):
        message = _receive(conn, START_TIMEOUT_S)
        if message == "started":
            continue
        runtime._record(rank, message)
        error = runtime.failure() or f"worker rank {rank} did not start (exit code {process.exitcode})"
        runtime.close()
        raise RuntimeError(error)


def _receive(conn: Connection, timeout_s: float) -> object | None:
    """The worker's next message, or None if none came within the timeout or the worker closed its end."""
    try:
        return conn.recv() if conn.poll(timeout_s) else None
    except EOFError:
        return None
