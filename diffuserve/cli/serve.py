"""`diffuserve serve [MODEL]`: the OpenAI-compatible HTTP server's command.

Its flags come from the config dataclasses' field docstrings: `server.config.ServerConfig` for the server's and
`diffuserve.config.EngineConfig` for the engine's. Torch, FastAPI and the engine are imported inside `run`, so
`diffuserve --help` stays fast. MODEL is a directory, a Hugging Face Hub id
(`diffuserve.model.hub`), or nothing for the bundled default model. The API key may also come from
DIFFUSERVE_API_KEY (the flag wins).

The listening socket is bound before the model is fetched or loaded, so a busy port fails at once; SIGTERM or
Ctrl-C stops accepting connections and lets open requests finish for at most --shutdown-timeout seconds. An
engine that dies (its loop crashed, or a worker rank of a multi-process engine failed) is answered with 503 for
DEAD_ENGINE_EXIT_S, then the server exits with code 1, so that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from diffuserve.config import EngineConfig, add_config_arguments, engine_config_from_args
from diffuserve.model.hub import add_hub_arguments, resolve_model
from diffuserve.server.config import ServerConfig
from diffuserve.server.loading import LoadingResponder
from diffuserve.server.replicas import add_replica_arguments, is_replicated, run_replicated

API_KEY_ENV = "DIFFUSERVE_API_KEY"
DEAD_ENGINE_EXIT_S = 3.0
"""How long a server whose engine died keeps answering 503 (/health included) before it exits."""

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="model directory or Hugging Face Hub id (default: the bundled default model)",
    )
    add_hub_arguments(parser)
    add_config_arguments(parser, ServerConfig)
    add_config_arguments(parser, EngineConfig, skip=("model",))
    add_replica_arguments(parser)


def server_config_from_args(args: argparse.Namespace, model_arg: str | None, model_dir: str) -> ServerConfig:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig) if hasattr(args, f.name)}
    given.setdefault("api_key", os.environ.get(API_KEY_ENV) or None)
    given.setdefault("served_model_name", model_arg or Path(model_dir).name)
    return ServerConfig(**given)


def run(args: argparse.Namespace) -> int:
    from diffuserve.distributed.group import launched_by_torchrun

    if is_replicated(args):
        return run_replicated(args, lambda: resolve_model(args.model, args.revision, args.download_dir))

    is_worker = launched_by_torchrun() and os.environ["RANK"] != "0"
    config = server_config_from_args(args, args.model, args.model or "default-model")
    sock = None if is_worker else bind(config.host, config.port)  # before the model: a busy port fails at once
    loading = LoadingResponder(sock).start() if sock is not None else None  # 503 until uvicorn takes over
    try:
        return _serve(args, config, sock, loading)
    finally:
        if loading is not None:
            loading.stop()
        if sock is not None:
            sock.close()


def _serve(
    args: argparse.Namespace, config: ServerConfig, sock: socket.socket | None, loading: LoadingResponder | None
) -> int:
    model_dir = resolve_model(args.model, args.revision, args.download_dir)
    config = server_config_from_args(args, args.model, model_dir)
    engine_config = engine_config_from_args(model_dir, args)
    if engine_config.expert_stats is None:  # /metrics reports them
        engine_config = dataclasses.replace(engine_config, expert_stats=True)

    from diffuserve.engine.engine_setup import run_if_torchrun_worker

    if run_if_torchrun_worker(engine_config):
        return 0  # a torchrun rank > 0: it served rank 0's forwards until rank 0 stopped
    assert sock is not None

    import uvicorn

    from diffuserve.engine.gc_heap import freeze_heap
    from diffuserve.engine.llm_engine import LLMEngine
    from diffuserve.server.app import build_app

    logging.basicConfig(format="%(levelname)-9s %(name)s: %(message)s")
    logging.getLogger("diffuserve").setLevel(logging.INFO)
    engine = LLMEngine(engine_config)
    logger.info(
        "serving %r from %s: max_model_len %d, %d KV pages of %d tokens",
        config.served_model_name,
        model_dir,
        engine.max_model_len,
        engine.pool.num_pages,
        engine.pool.page_size,
    )
    logger.info("%s", rank_layout(engine_config))
    port = sock.getsockname()[1]
    print(usage_hint(config, port), flush=True)
    app = build_app(engine, config)
    bridge = app.state.serving.bridge
    server = _server_class(lambda: bridge.dead_reason)(
        uvicorn.Config(
            app,
            host=config.host,
            port=port,
            log_level=config.uvicorn_log_level,
            # uvicorn annotates this int, but only ever passes it to asyncio.wait_for as a timeout (float seconds)
            timeout_graceful_shutdown=config.shutdown_timeout,  # type: ignore[arg-type]
        )
    )
    assert loading is not None
    freeze_heap("diffuserve serve")  # what the engine and the app hold for the process's life (engine/gc_heap.py)
    loading.stop()
    # uvicorn re-raises the Ctrl-C it handled once it has shut down; uvicorn.run swallows it too.
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
    finally:
        engine.shutdown()  # the worker ranks and the process group go with the server
    if server.engine_died:
        logger.error("exiting with code 1: the engine is not running: %s", bridge.dead_reason)
        return 1
    return 0


def rank_layout(config: EngineConfig) -> str:
    """One line: how many ranks run the model, how it is split, and who started them."""
    from diffuserve.distributed.group import launched_by_torchrun

    size, parallel = config.parallel.tensor_parallel_size, config.parallel
    if size == 1:
        return "ranks: 1 (one process)"
    split = "heads and widths split" + (", whole experts per rank" if parallel.enable_expert_parallel else "")
    workers = "rank 1" if size == 2 else f"ranks 1-{size - 1}"
    started = "started by torchrun" if launched_by_torchrun() else "spawned by rank 0"
    return f"ranks: {size} ({split}); rank 0 serves HTTP and schedules, {workers} ({started}) run its forwards"


def _server_class(dead_reason: Callable[[], str | None]) -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server on our pre-bound socket, announcing its address as uvicorn does for its own; it stops
        DEAD_ENGINE_EXIT_S after `dead_reason()` first says the engine died (engine_died is then True)."""

        engine_died = False
        _dead_since: float | None = None

        async def on_tick(self, counter: int) -> bool:
            if await super().on_tick(counter):
                return True
            if self._dead_since is None and dead_reason() is not None:
                self._dead_since = time.monotonic()
            self.engine_died = self._dead_since is not None
            return self._dead_since is not None and time.monotonic() - self._dead_since >= DEAD_ENGINE_EXIT_S

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, self.config.port
                )

    return Server


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not yet listening; ValueError naming the flag if it cannot be bound."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ValueError(f"host: cannot listen on {host!r} ({e}); pass --host with a local address") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restarts reuse a TIME_WAIT port
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ValueError(
            f"port: cannot listen on {host}:{port} ({e.strerror}); another process may be using "
            "it: pick another with --port"
        ) from None
    return sock


def usage_hint(config: ServerConfig, port: int) -> str:
    """A curl command and a Python one-liner (openai client) that work against this server as started, and the
    web console's address."""
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    base = f"http://{host}:{port}/v1"
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if config.api_key else ""  # never echo the key itself
    key = f"os.environ['{API_KEY_ENV}']" if config.api_key else "'unused'"
    messages = [{"role": "user", "content": "What is 27+15?"}]
    body = json.dumps({"model": config.served_model_name, "messages": messages})
    client = (
        f"import os; from openai import OpenAI; c = OpenAI(base_url='{base}', api_key={key}); "
        f"print(c.chat.completions.create(model={config.served_model_name!r}, "
        f"messages={messages!r}).choices[0].message.content)"
    )
    console = "" if config.no_web_console else f"\n  or open the web console: http://{host}:{port}/"
    return (
        f"Try it:\n  curl -s {base}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'\n"
        f'  python -c "{client}"{console}'
    )
