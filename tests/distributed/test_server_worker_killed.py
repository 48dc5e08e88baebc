"""`diffuserve serve --tensor-parallel-size 2` whose worker rank is killed (SIGKILL, no word to rank 0): the server
answers 503 (engine_unavailable) to /health and to requests, and exits with code 1 within 30 s of the kill, for
SDAR-MoE and for clover_moe. Also the rank layout line at start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

EXIT_WITHIN_S = 30.0


def _wait_for_port(server: subprocess.Popen, lines: list[str]) -> int:
    """uvicorn logs the port it bound; the lines before it (the rank layout among them) go into `lines`."""
    assert server.stderr is not None
    for line in server.stderr:
        lines.append(line)
        if match := re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line):
            return int(match.group(1))
    raise AssertionError(f"the server exited with {server.wait()} before listening: {''.join(lines)[-2000:]}")


def _serve(model_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DIFFUSERVE_API_KEY", None)
    command = [sys.executable, "-m", "diffuserve", "serve", str(model_dir), "--port", "0", "--device", "cpu"]
    command += ["--num-pages", "64", "--max-model-len", "128", "--tensor-parallel-size", "2"]
    command += ["--uvicorn-log-level", "info", "--served-model-name", "m"]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def _worker(server: subprocess.Popen) -> psutil.Process:
    """The spawned rank 1 (a multiprocessing spawn child, not its resource tracker)."""
    children = psutil.Process(server.pid).children()
    commands = {c: " ".join(c.cmdline()) for c in children}
    workers = [c for c, line in commands.items() if "spawn_main" in line and "resource_tracker" not in line]
    assert len(workers) == 1, [c.cmdline() for c in children]
    return workers[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["sdar", "clover"])
def test_a_killed_worker_makes_the_server_answer_503_and_exit(request, family):
    model_dir = (
        request.getfixturevalue("tiny_model_dir") if family == "sdar" else request.getfixturevalue("clover_dirs")[True]
    )
    server = _serve(model_dir)
    try:
        started: list[str] = []
        port = _wait_for_port(server, started)
        url = f"http://127.0.0.1:{port}"
        body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        _worker(server).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        answers = []
        while server.poll() is None and time.monotonic() - killed < EXIT_WITHIN_S:
            try:
                answers.append(httpx.post(f"{url}/v1/completions", json=body, timeout=10))
                answers.append(httpx.get(f"{url}/health", timeout=10))
            except httpx.TransportError:  # the server is closing its socket
                time.sleep(0.1)
        server.wait(max(1.0, EXIT_WITHIN_S - (time.monotonic() - killed)))
        stderr = server.stderr.read() if server.stderr else ""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    exited_after = time.monotonic() - killed
    assert server.returncode == 1 and exited_after < EXIT_WITHIN_S, stderr[-2000:]
    print(f"exited {exited_after:.1f} s after the kill")
    refused = [a for a in answers if a.status_code == 503]
    assert refused and {a.json()["error"]["code"] for a in refused} == {"engine_unavailable"}, answers
    assert all(a.status_code == 503 for a in answers[answers.index(refused[0]) :]), "the engine came back?"
    assert "worker rank 1" in stderr and "exiting with code 1" in stderr
    layout = "ranks: 2 (heads and widths split); rank 0 serves HTTP and schedules, rank 1 (spawned by rank 0)"
    assert layout in "".join(started)
