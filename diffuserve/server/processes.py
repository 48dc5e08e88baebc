"""Child processes that must not outlive their parent: spawned in their own session with a death signal, stopped
with SIGTERM then SIGKILL to the whole process group, and polled until an HTTP endpoint answers. Used by the
replicated deployment (replicas.py); knows nothing of what the children are.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free now (another process may take one before it is bound: that fails loudly)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def spawn(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`command` in its own session (its own process group); the kernel sends it SIGTERM if this process dies."""
    return subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_all(processes: Sequence[subprocess.Popen[Any] | None], timeout_s: float, groups: bool = True) -> None:
    """SIGTERM to each, up to `timeout_s` in all for them to exit, then SIGKILL to each one's whole process group
    (`spawn`'s children lead their own: the ranks a server spawned, anything a leader that exited left behind);
    with `groups=False` (children started in the caller's group) SIGKILL to each child alone."""
    running = [p for p in processes if p is not None]
    for process in running:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if groups:
                os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader while a member lives
            elif process.poll() is None:
                process.kill()
        process.wait()


def wait_until(
    ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: float, what: str, stopping: threading.Event
) -> None:
    """Polls `ready` until true; KeyboardInterrupt once `stopping` is set; ValueError if `alive` turns false or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if stopping.is_set():
            raise KeyboardInterrupt
        if not alive():
            raise ValueError(f"{what} exited before it was ready (its log is above)")
        if time.monotonic() > deadline:
            raise ValueError(f"{what} was not ready after {timeout_s:.0f} s (raise --replica-startup-timeout)")
        time.sleep(0.2)


def answers(url: str) -> bool:
    """Whether GET `url` is a 200 now."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
