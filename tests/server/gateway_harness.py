"""Real processes for the gateway tests: `diffuserve serve` replicas of the bundled model and the smg / vllm-router
binaries in front of them, on 127.0.0.1, started and stopped with the launcher's own helpers
(diffuserve.server.processes), a replica's Prometheus counters read from its /metrics, and the check that no
process of a test is left behind (psutil)."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from diffuserve.server.gateways import GatewaySpec, find_binary, gateway_command
from diffuserve.server.processes import answers, free_ports, spawn, stop_all, wait_until

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
START_TIMEOUT_S = 180.0


def gateway_binary(name: str) -> str:
    """The gateway's executable, or a skip naming why (it is in the test extra: a skip means a broken install)."""
    try:
        return find_binary(name)
    except ValueError as e:
        pytest.skip(str(e))


@dataclass
class Server:
    url: str
    process: object = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid  # type: ignore[attr-defined]

    def metric(self, name: str) -> float:
        """The sum of one `diffuserve:` series over its label sets (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        pattern = rf"^diffuserve:{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$"
        return sum(float(value) for value in re.findall(pattern, text, re.M))


def serve_command(port: int, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "diffuserve",
        "serve",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
        *flags,
    ]


def start_replicas(flag_sets: list[list[str]]) -> list[Server]:
    """One bundled-model server per flag set, all loading at once; returns when every /health answers."""
    servers = [
        Server(f"http://127.0.0.1:{port}", spawn(serve_command(port, *flags), ENV))
        for port, flags in zip(free_ports(len(flag_sets)), flag_sets)
    ]
    for server in servers:
        alive = server.process.poll  # type: ignore[attr-defined]
        wait_until(
            lambda s=server: answers(s.url + "/health"),
            lambda a=alive: a() is None,
            START_TIMEOUT_S,
            server.url,
            threading.Event(),
        )
    return servers


def start_gateway(name: str, policy: str, replicas: Iterable[Server], *extra: str) -> Server:
    port, metrics_port = free_ports(2)
    spec = GatewaySpec(name, "127.0.0.1", port, metrics_port, [r.url for r in replicas], policy, 1, list(extra))
    process = spawn(gateway_command(spec, gateway_binary(name)), ENV)
    wait_until(lambda: answers(spec.url + "/v1/models"), lambda: process.poll() is None, 60, name, threading.Event())
    return Server(spec.url, process)


def stop(servers: Iterable[Server]) -> None:
    stop_all([s.process for s in servers], 30)  # type: ignore[misc]


def assert_no_strays(pids: Iterable[int]) -> None:
    """None of `pids` is still running (a zombie not yet reaped by its parent counts as gone)."""
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left behind: {alive}"


def family(pid: int) -> set[int]:
    """`pid` and its descendants now."""
    try:
        process = psutil.Process(pid)
        return {pid, *(child.pid for child in process.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()
