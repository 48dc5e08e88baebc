"""503 while the model loads: the responder answers every request on the bound socket with an OpenAI-shaped 503
and hands the socket back as it found it (listening); `diffuserve serve` as users run it answers /health 503
before it answers 200 (a gateway or a probe sees a worker that is starting, not a closed port)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from diffuserve.server.loading import LoadingResponder
from diffuserve.server.processes import free_ports, stop_all


def test_the_responder_answers_503_and_hands_the_socket_back():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    loading = LoadingResponder(sock).start()
    try:
        for path in ("/health", "/v1/models"):
            response = httpx.get(url + path, timeout=10)
            assert response.status_code == 503 and response.headers["Retry-After"] == "5"
            assert response.json()["error"]["code"] == "loading"
        posted = httpx.post(url + "/v1/completions", json={"prompt": "x" * 100_000}, timeout=10)
        assert posted.status_code == 503
    finally:
        loading.stop()
        loading.stop()  # idempotent: the CLI stops it before uvicorn starts and again on the way out
    with socket.create_connection(sock.getsockname(), timeout=5):  # still listening: the backlog holds it
        accepted, _ = sock.accept()
        accepted.close()
    sock.close()


def test_serve_answers_503_while_loading_then_200(tiny_model_dir: Path):
    port = free_ports(1)[0]
    command = [sys.executable, "-m", "diffuserve", "serve", str(tiny_model_dir), "--device", "cpu", "--port", str(port)]
    process = subprocess.Popen(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while 200 not in seen and time.monotonic() < deadline and process.poll() is None:
            try:
                seen.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
            except httpx.TransportError:
                time.sleep(0.01)  # not bound yet (the interpreter is starting)
    finally:
        stop_all([process], 30, groups=False)
    assert seen and seen[0] == 503 and seen[-1] == 200 and set(seen) == {503, 200}, seen
