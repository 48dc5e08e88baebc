"""The life of an `LLM`: four parallel engines (tensor parallel 2, and 2 with expert parallelism) created one after
another in one process, each ended another way (`shutdown()`, leaving `with`, `del` and garbage collection),
each giving the one-process engine's tokens; after each, nothing of it is left: no child process, no thread, no
shared-memory segment, no listening port, no process group, and a later call on a shut-down `LLM` says so."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from diffuserve import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True, threshold=0.5)
PROMPTS = [[5, 9, 14, 2, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
LAYOUTS = [
    dict(tensor_parallel_size=2),
    dict(tensor_parallel_size=2, enable_expert_parallel=True),
    dict(tensor_parallel_size=2),
    dict(tensor_parallel_size=2, enable_expert_parallel=True),
]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)]


def _resources() -> dict[str, object]:
    """What an engine could leave behind in this process. Python's multiprocessing resource tracker (one per
    interpreter, started by the first spawn) is not an engine's."""
    me = psutil.Process()
    children = [p for p in me.children(recursive=True) if "resource_tracker" not in " ".join(_cmdline(p))]
    return {
        "children": sorted(p.pid for p in children),
        "threads": sorted(t.name for t in threading.enumerate()),
        "native threads": me.num_threads(),
        "shared memory": _shared_memory(me),
        "listening ports": sorted(c.laddr.port for c in me.net_connections("inet") if c.status == psutil.CONN_LISTEN),
        "process group": dist.is_initialized(),
    }


def _shared_memory(me: psutil.Process) -> list[str]:
    """The entries of /dev/shm less those a process outside this one's tree holds (mapped or open): what other
    tests running beside this one (pytest-xdist's other workers) or a browser keep there is theirs, while what an
    engine leaves behind is held by this process or by none."""
    if not os.path.isdir("/dev/shm"):
        return []
    entries = set(os.listdir("/dev/shm"))
    ours = {me.pid, *(p.pid for p in me.children(recursive=True))}
    held: set[str] = set()
    for process in psutil.process_iter():
        if process.pid in ours:
            continue
        try:
            paths = [m.path for m in process.memory_maps()] + [f.path for f in process.open_files()]
        except psutil.Error:  # gone, or not ours to read
            continue
        held |= {os.path.basename(p) for p in paths if p.startswith("/dev/shm/")}
    return sorted(entries - held)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _end(llm: LLM, how: str) -> None:
    if how == "shutdown":
        llm.shutdown()
        with pytest.raises(RuntimeError, match="LLM: this LLM was shut down; create a new one"):
            llm.generate("x")
        llm.shutdown()  # idempotent


@pytest.mark.timeout(300)
def test_four_parallel_engines_in_a_row_leave_nothing_behind(clover_dirs: dict[bool, Path]):
    model = str(clover_dirs[True])
    with LLM(model, num_pages=64) as single:
        expected = _tokens(single)
    before = _resources()
    for layout, how in zip(LAYOUTS, ["shutdown", "with", "del", "shutdown"]):
        if how == "with":
            with LLM(model, num_pages=64, **layout) as llm:
                assert _tokens(llm) == expected, layout
                assert _resources()["children"], "a parallel engine runs its ranks in child processes"
        else:
            llm = LLM(model, num_pages=64, **layout)
            assert _tokens(llm) == expected, layout
            _end(llm, how)
            del llm
            gc.collect()
        assert _resources() == before, (layout, how)
