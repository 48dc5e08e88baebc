"""Where and on what a benchmark ran: git revision, hardware, software, threads, machine load, peak memory.

Every benchmark JSON carries this block, so a number can be traced to the code and the machine that produced
it (most published diffusion speed numbers omit the hardware; see docs/benchmarks/index.md). Knows nothing of what
is measured.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_revision() -> dict[str, Any]:
    """{"sha": short sha or None outside a checkout, "dirty": uncommitted changes to tracked files}."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "--short=12", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if sha else None
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes(device: torch.device | None = None) -> int:
    """Device memory: the GPU's total, or the host's physical RAM."""
    if device is not None and device.type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def hardware(device: torch.device | None = None) -> dict[str, Any]:
    """The device a benchmark ran on (None: only the host, as for a client)."""
    info: dict[str, Any] = {
        "device": str(device or "host"),
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": memory_bytes(device),
    }
    if device is not None and device.type == "cuda":
        import torch

        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages: above the core count, other processes competed for the CPU."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """The block every JSON line carries; with a device also torch's version and thread count."""
    info: dict[str, Any] = {
        "git": git_revision(),
        "hardware": hardware(device),
        "python": platform.python_version(),
        "platform": sys.platform,
        "load_average_start": load_average(),
    }
    if device is not None:
        import torch

        info |= {"torch": torch.__version__, "threads": torch.get_num_threads()}
    return info


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory allocated by the process; on CPU its peak resident set. Both only ever grow, so they
    cover everything the process did before (model loading, the probes, every run)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    # Linux reports kilobytes, macOS bytes.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)
