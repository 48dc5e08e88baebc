"""The gateways `diffuserve serve --replicas N --gateway NAME` can put in front of its replicas: SMG (Shepherd
Model Gateway, `pip install smg`) and vllm-router (`pip install vllm-router`), both Rust binaries installed by
their wheels. This module knows how to find each binary, spell its command line, and ask whether it is ready;
it knows nothing of the replicas' processes (replicas.py) or of how a gateway routes.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

GATEWAYS = ("smg", "vllm-router")
LOG_LEVELS = {"smg": "warn", "vllm-router": "warning"}


@dataclass(frozen=True)
class GatewaySpec:
    """One gateway process: where it listens, whom it routes to, and how."""

    name: str
    host: str
    port: int
    metrics_port: int
    worker_urls: list[str]
    policy: str = "cache_aware"
    health_check_interval_s: int = 2
    extra_args: list[str] = field(default_factory=list)
    """Passed through as they are (`--gateway-args "..."`), after ours: the gateway's own flags win."""

    def __post_init__(self) -> None:
        if self.name not in GATEWAYS:
            raise ValueError(f"gateway: got {self.name!r}, must be one of {GATEWAYS}")
        if self.health_check_interval_s < 1:
            raise ValueError(f"gateway_health_check_interval: got {self.health_check_interval_s}, must be >= 1")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def find_binary(name: str) -> str:
    """The gateway's executable: on PATH, or beside this Python (a virtual environment's bin/ not activated)."""
    beside = Path(sys.executable).parent / name
    found = shutil.which(name) or (str(beside) if beside.exists() else None)
    if found is None:
        raise ValueError(f"gateway: {name} is not installed; install it with `pip install {name}`")
    return found


def gateway_command(spec: GatewaySpec, binary: str) -> list[str]:
    """The gateway's command line: listen on host:port, route `worker_urls` by `policy`, health-check them every
    `health_check_interval_s` seconds (on /health), serve its own Prometheus metrics on `metrics_port`."""
    common = [
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--worker-urls",
        *spec.worker_urls,
        "--policy",
        spec.policy,
        "--prometheus-port",
        str(spec.metrics_port),
        "--health-check-interval-secs",
        str(spec.health_check_interval_s),
        "--health-check-endpoint",
        "/health",
        "--log-level",
        LOG_LEVELS[spec.name],
    ]
    launch = ["launch"] if spec.name == "smg" else []
    return [binary, *launch, *common, *spec.extra_args]


def split_args(text: str | None) -> list[str]:
    return shlex.split(text) if text else []
