"""ServerConfig: the HTTP server's settings (the engine's are `diffuserve.config.EngineConfig`).

A frozen dataclass whose field docstrings are the `diffuserve serve` flags' help, like the engine configs.
Knows nothing of FastAPI or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
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
    """Requests accepted but not yet scheduled for their first step; past this, new requests get 429."""
    max_n: int = 128
    """Largest `n` (completions per prompt) a request may ask for."""
    uvicorn_log_level: str = "info"
    """Log level of the HTTP server: critical, error, warning, info, debug or trace."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: got {self.port}, must be in [0, 65535]")
        if self.max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests: got {self.max_waiting_requests}, must be >= 1")
        if self.max_n < 1:
            raise ValueError(f"max_n: got {self.max_n}, must be >= 1")
        if self.uvicorn_log_level not in LOG_LEVELS:
            raise ValueError(f"uvicorn_log_level: got {self.uvicorn_log_level!r}, must be one of {LOG_LEVELS}")
        if self.api_key == "":
            raise ValueError("api_key: must not be empty (omit it to disable authentication)")
