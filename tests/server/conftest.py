"""Live servers for the server tests: the real app under uvicorn on 127.0.0.1 with an ephemeral port, in a thread
of the test process (so that tests can reach the engine, e.g. to inject a step failure), stopped by the fixture.

Torch runs single-threaded here: the engine-loop thread, uvicorn and the test client share 2 cores, and two
intra-op threads per forward on a contended machine make tiny-model steps tens of times slower.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
import uvicorn

from diffuserve.config import EngineConfig
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.server.app import build_app
from diffuserve.server.config import ServerConfig
from diffuserve.server.serving import OpenAIServing

API_KEY = "test-key"
MODEL_NAME = "tiny"


class LiveServer:
    def __init__(self, model_dir: Path, config: ServerConfig, **engine_kwargs: Any) -> None:
        engine = LLMEngine(EngineConfig.from_kwargs(str(model_dir), device="cpu", **engine_kwargs))
        self.app = build_app(engine, config)
        self.config = config
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def serving(self) -> OpenAIServing:
        return self.app.state.serving

    @property
    def engine(self) -> LLMEngine:
        return self.serving.bridge.engine

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()

    def client(self, api_key: str | None = None, **kwargs: Any) -> openai.OpenAI:
        key = api_key or self.config.api_key or "unused"
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120, **kwargs)

    def async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        key = self.config.api_key or "unused"
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120, **kwargs)

    def post(self, path: str, body: Any = None, content: bytes | None = None, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        if content is not None:
            headers["Content-Type"] = "application/json"
        return httpx.post(self.url + path, json=body, content=content, headers=headers, timeout=120, **kwargs)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one `diffuserve:` series from /metrics (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        total = 0.0
        for line in text.splitlines():
            match = re.match(rf"diffuserve:{re.escape(name)}\{{(.*)\}} (\S+)$", line)
            if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
                total += float(match.group(2))
        return total

    def wait_for(self, condition: Any, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.05)


@pytest.fixture(scope="session")
def single_threaded_torch() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def live_server(tiny_model_dir: Path, single_threaded_torch: None) -> Iterator[LiveServer]:
    """The shared server: API key on, 64 sequences per step, a 192-token context, n at most 8."""
    config = ServerConfig(api_key=API_KEY, served_model_name=MODEL_NAME, max_n=8)
    server = LiveServer(tiny_model_dir, config, num_pages=1024, max_num_seqs=64, max_model_len=192).start()
    yield server
    server.stop()


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    """The JSON payloads of an SSE response (and the final "[DONE]")."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)
