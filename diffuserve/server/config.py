"""`ServerConfig`: the HTTP server's settings (`diffuserve serve` flags), a frozen dataclass whose field docstrings
are the flags' help, like the engine's config dataclasses (`diffuserve.config`). Validates its own values (one
line naming the field); knows nothing of how they are read (cli/serve.py) or used (app.py, serving.py).
"""

from __future__ import annotations

import dataclasses

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 for every interface)."""
    port: int = 8000
    """TCP port (0 = any free port; the chosen one is logged)."""
    api_key: str | None = None
    """When set, requests to every route but /health, /version, /metrics and the docs must carry
    `Authorization: Bearer <key>`. Also read from DIFFUSERVE_API_KEY."""
    served_model_name: str | None = None
    """Model name clients use in `model` and see in /v1/models (default: the MODEL argument)."""
    max_waiting_requests: int = 512
    """Sequences (prompts x n) accepted but not yet scheduled for their first step; past this, new requests get
    429 (busy, retry), and a single request larger than this gets 400 (it could never be queued)."""
    max_n: int = 128
    """Largest `n` (completions per prompt) a request may ask for."""
    max_request_bytes: int | None = None
    """Largest request body in bytes; larger ones get 413 before they are read (default: max_model_len x 64
    bytes + 1 MiB, room for any prompt that fits the context)."""
    shutdown_timeout: float = 30.0
    """Seconds that SIGTERM or Ctrl-C lets open requests finish before cancelling them."""
    metrics_vllm_names: bool = False
    """Name the /metrics series that vLLM also exports `vllm:...` (instead of `diffuserve:...`), so that
    dashboards made for vLLM work unchanged."""
    uvicorn_log_level: str = "info"
    """Log level of the HTTP server: critical, error, warning, info, debug or trace."""
    no_web_console: bool = False
    """Do not serve the web console (GET /: chat, the denoising view, the planner, live metrics)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: got {self.port}, must be in [0, 65535]")
        if self.max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests: got {self.max_waiting_requests}, must be >= 1")
        if self.max_n < 1:
            raise ValueError(f"max_n: got {self.max_n}, must be >= 1")
        if self.max_request_bytes is not None and self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes: got {self.max_request_bytes}, must be >= 1")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout: got {self.shutdown_timeout}, must be >= 0")
        if self.uvicorn_log_level not in LOG_LEVELS:
            raise ValueError(f"uvicorn_log_level: got {self.uvicorn_log_level!r}, must be one of {LOG_LEVELS}")
        if self.api_key == "":
            raise ValueError("api_key: must not be empty (omit it to disable authentication)")
