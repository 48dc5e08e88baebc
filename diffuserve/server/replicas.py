"""`diffuserve serve --replicas N --gateway smg|vllm-router`: a data-parallel deployment on one machine, for trying
it. N `diffuserve serve` processes (each with the engine flags given, so each may be `-tp P` on its own GPUs) on
their own ports on 127.0.0.1, then the gateway in front on --host/--port once every replica's /health answers 200;
the deployment is ready when the gateway answers /v1/models.

Each child runs in its own session (its own process group, with whatever worker ranks it spawns), and asks the
kernel for SIGTERM should this launcher die. SIGTERM or Ctrl-C stops the gateway, then the replicas (each drains
its open requests for --shutdown-timeout seconds), then kills whatever is left of their process groups: nothing
outlives the command. A replica that exits after it was ready is restarted on its port (the gateway's health
check takes it back); one that exits before it was ready, or a gateway that exits, stops everything.

Knows nothing of HTTP serving itself (cli/serve.py) or of gateway flags (gateways.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from diffuserve.server.config import ServerConfig
from diffuserve.server.gateways import GATEWAYS, GatewaySpec, find_binary, gateway_command, split_args
from diffuserve.server.processes import answers, free_ports, spawn, stop_all, wait_until

LAUNCHER_FLAGS = frozenset(
    {
        "command",
        "run",
        "model",
        "revision",
        "download_dir",
        "host",
        "port",
        "replicas",
        "gateway",
        "gateway_policy",
        "gateway_args",
        "gateway_health_check_interval",
        "replica_startup_timeout",
    }
)
"""Namespace entries the launcher consumes; every other flag given is passed to each replica."""
GATEWAY_STOP_S = 10.0


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replicas behind a gateway (one machine)")
    group.add_argument(
        "--replicas", type=int, default=1, help="servers to start, each on its own port, behind --gateway (default 1)"
    )
    group.add_argument(
        "--gateway",
        choices=GATEWAYS,
        default=None,
        help="the gateway in front of the replicas, listening on --host/--port (default with --replicas > 1: smg)",
    )
    group.add_argument(
        "--gateway-policy",
        default="cache_aware",
        help="the gateway's routing policy: cache_aware, round_robin, power_of_two, ... (default cache_aware)",
    )
    group.add_argument(
        "--gateway-health-check-interval",
        type=int,
        default=2,
        metavar="S",
        help="seconds between the gateway's /health probes of each replica (default 2)",
    )
    group.add_argument(
        "--gateway-args", default=None, metavar="ARGS", help='more gateway flags, as one string ("--flag value ...")'
    )
    group.add_argument(
        "--replica-startup-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a replica may take to load its model and answer /health (default 600)",
    )


def is_replicated(args: argparse.Namespace) -> bool:
    return getattr(args, "replicas", 1) != 1 or getattr(args, "gateway", None) is not None


def replica_flags(args: argparse.Namespace) -> list[str]:
    """The flags given on the command line, spelled again for each replica (booleans as true/false)."""
    flags: list[str] = []
    for name, value in sorted(vars(args).items()):
        if name in LAUNCHER_FLAGS or value is None:
            continue
        values = value if isinstance(value, list) else [value]
        flags += ["--" + name.replace("_", "-"), *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return flags


def gpu_slices(num_gpus: int, replicas: int, tensor_parallel_size: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each replica: consecutive groups of `tensor_parallel_size` GPUs, or None for all
    (no GPU, or too few to give each replica its own)."""
    if num_gpus < replicas * tensor_parallel_size:
        return [None] * replicas
    tp = tensor_parallel_size
    return [",".join(str(g) for g in range(i * tp, (i + 1) * tp)) for i in range(replicas)]


@dataclass
class Replica:
    index: int
    port: int
    command: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, note: str = "") -> None:
        self.process = spawn(self.command, self.env)
        say(f"replica {self.index}: {self.url} pid {self.process.pid}{note}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def say(line: str) -> None:
    print(line, flush=True)


def run_replicated(args: argparse.Namespace, resolve_model: Callable[[], str]) -> int:
    """The deployment of `args` until SIGTERM or Ctrl-C (0), or until the gateway exits (1). `resolve_model` gives
    the model directory (downloading it if needed: the command's, which knows the hub; the server never loads it)."""
    from diffuserve.distributed.group import launched_by_torchrun

    if args.replicas < 1:
        raise ValueError(f"replicas: got {args.replicas}, must be >= 1")
    if launched_by_torchrun():
        raise ValueError("replicas: --replicas / --gateway cannot run under torchrun; start one torchrun per replica")
    name = args.gateway or "smg"
    binary = find_binary(name)  # before anything is downloaded or started
    model_dir = resolve_model()  # once, not once per replica
    port, host = getattr(args, "port", ServerConfig.port), getattr(args, "host", ServerConfig.host)
    ports = free_ports(args.replicas + 2) if port == 0 else list(range(port, port + args.replicas + 2))
    replicas = _replicas(args, model_dir, ports[1 : 1 + args.replicas])
    spec = GatewaySpec(
        name,
        host,
        ports[0],
        ports[-1],
        [r.url for r in replicas],
        args.gateway_policy,
        args.gateway_health_check_interval,
        split_args(args.gateway_args),
    )
    with _stop_signals() as stopping:
        gateway: subprocess.Popen[bytes] | None = None
        try:
            gateway = _start(replicas, spec, binary, args.replica_startup_timeout, stopping)
            return _supervise(replicas, gateway, stopping)
        except KeyboardInterrupt:
            return 0
        finally:
            say("stopping the gateway and the replicas")
            stop_all([gateway], GATEWAY_STOP_S)
            shutdown = getattr(args, "shutdown_timeout", ServerConfig.shutdown_timeout)
            stop_all([r.process for r in replicas], shutdown + GATEWAY_STOP_S)


def _replicas(args: argparse.Namespace, model_dir: str, ports: list[int]) -> list[Replica]:
    flags = replica_flags(args)
    if "served_model_name" not in vars(args):
        flags += ["--served-model-name", args.model or Path(model_dir).name]
    if "uvicorn_log_level" not in vars(args):
        flags += ["--uvicorn-log-level", "warning"]  # not one access-log line per health probe
    base = [sys.executable, "-m", "diffuserve", "serve", model_dir, *flags, "--host", "127.0.0.1", "--port"]
    tp = getattr(args, "tensor_parallel_size", 1)
    devices = _visible_gpus() if getattr(args, "device", "auto") != "cpu" else []
    replicas = []
    for i, (port, gpus) in enumerate(zip(ports, gpu_slices(len(devices), len(ports), tp))):
        env = dict(os.environ)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[int(g)] for g in gpus.split(","))
        replicas.append(Replica(i, port, [*base, str(port)], env))
    return replicas


def _visible_gpus() -> list[str]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[:count] if visible else [str(g) for g in range(count)]


def _start(
    replicas: list[Replica], spec: GatewaySpec, binary: str, timeout_s: float, stopping: threading.Event
) -> subprocess.Popen[bytes]:
    for replica in replicas:
        replica.start()
    for replica in replicas:
        health = functools.partial(answers, replica.url + "/health")
        wait_until(health, replica.alive, timeout_s, f"replica {replica.index}", stopping)
        say(f"replica {replica.index}: ready")
    gateway = spawn(gateway_command(spec, binary))
    wait_until(lambda: answers(spec.url + "/v1/models"), lambda: gateway.poll() is None, 60, spec.name, stopping)
    say(
        f"gateway {spec.name} ({spec.policy}): {spec.url} pid {gateway.pid} -> {len(replicas)} replicas; "
        f"its metrics: http://127.0.0.1:{spec.metrics_port}/metrics"
    )
    say(f"ready: {spec.url}/v1")
    return gateway


def _supervise(replicas: list[Replica], gateway: subprocess.Popen[bytes], stopping: threading.Event) -> int:
    """Restarts a replica that exits; returns 0 when asked to stop, 1 if the gateway exits."""
    while not stopping.wait(0.5):
        if gateway.poll() is not None:
            say(f"the gateway exited with code {gateway.returncode}")
            return 1
        for replica in replicas:
            assert replica.process is not None
            if replica.process.poll() is not None:
                say(f"replica {replica.index} exited with code {replica.process.returncode}; restarting it")
                replica.start(" (restarted)")
    return 0


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT (Ctrl-C) while the deployment runs; the previous handlers after."""
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopping
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
