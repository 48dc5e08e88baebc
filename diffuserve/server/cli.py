"""`diffuserve serve [MODEL]`: the OpenAI-compatible HTTP server, and `ServerConfig`, its settings.

`ServerConfig` is a frozen dataclass whose field docstrings are the flags' help, like the engine config
dataclasses (`diffuserve.config.EngineConfig`), which give the engine's flags. Torch, FastAPI and the engine are
imported inside `run`, so `diffuserve --help` stays fast. Without MODEL the bundled default model is served. The
API key may also come from DIFFUSERVE_API_KEY (the flag wins).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from pathlib import Path

from diffuserve.config import EngineConfig, add_config_arguments, engine_config_from_args

API_KEY_ENV = "DIFFUSERVE_API_KEY"

logger = logging.getLogger(__name__)

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="model directory (default: the bundled default model)")
    add_config_arguments(parser, ServerConfig)
    add_config_arguments(parser, EngineConfig, skip=("model",))


def server_config_from_args(args: argparse.Namespace, model_arg: str | None, model_dir: str) -> ServerConfig:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig) if hasattr(args, f.name)}
    given.setdefault("api_key", os.environ.get(API_KEY_ENV) or None)
    given.setdefault("served_model_name", model_arg or Path(model_dir).name)
    return ServerConfig(**given)


def run(args: argparse.Namespace) -> int:
    from diffuserve.default_model import resolve_model

    model_dir = resolve_model(args.model)
    config = server_config_from_args(args, args.model, model_dir)
    engine_config = engine_config_from_args(model_dir, args)

    from diffuserve.engine.engine_setup import run_if_torchrun_worker

    if run_if_torchrun_worker(engine_config):
        return 0  # a torchrun rank > 0: it served rank 0's forwards until rank 0 stopped

    import uvicorn

    from diffuserve.engine.llm_engine import LLMEngine
    from diffuserve.server.app import build_app

    logging.basicConfig(format="%(levelname)-9s %(name)s: %(message)s")
    logging.getLogger("diffuserve").setLevel(logging.INFO)
    engine = LLMEngine(engine_config)
    logger.info("serving %r from %s: max_model_len %d, %d KV pages of %d tokens", config.served_model_name,
                model_dir, engine.max_model_len, engine.pool.num_pages, engine.pool.page_size)
    print(usage_hint(config), flush=True)
    uvicorn.run(build_app(engine, config), host=config.host, port=config.port, log_level=config.uvicorn_log_level)
    return 0


def usage_hint(config: ServerConfig) -> str:
    """A curl command and an OpenAI-client line that work against this server as started."""
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    base = f"http://{host}:{config.port or 'PORT'}/v1"
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if config.api_key else ""  # never echo the key itself
    body = json.dumps({"model": config.served_model_name, "messages": [{"role": "user", "content": "What is 27+15?"}]})
    return (
        f"Try it:\n  curl -s {base}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'\n"
        f"  python examples/openai_client.py {base}"
    )
