"""`diffuserve serve` as users run it: a subprocess on 127.0.0.1 with an ephemeral port, the API key from
DIFFUSERVE_API_KEY, engine flags from the command line, a Hub model id from the local cache with HF_HUB_OFFLINE,
SIGTERM with --shutdown-timeout; and config errors (a busy port among them, before the model loads) as one line,
exit code 2."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from diffuserve.cli.main import main
from diffuserve.cli.serve import usage_hint
from diffuserve.server.config import ServerConfig
from tests.test_hub import populate_hub_cache


def _wait_for_port(process: subprocess.Popen, timeout_s: float = 120, seen: list[str] | None = None) -> int:
    """uvicorn logs the port it bound (port 0 = any free one); the lines before it go to `seen`."""
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    for line in process.stderr:
        if seen is not None:
            seen.append(line)
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return int(match.group(1))
        assert time.monotonic() < deadline, "the server did not start in time"
    raise AssertionError(f"the server exited with {process.wait()} before listening")


def test_serve_subprocess(tiny_model_dir: Path):
    env = {**os.environ, "DIFFUSERVE_API_KEY": "env-key", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "diffuserve",
        "serve",
        str(tiny_model_dir),
        "--port",
        "0",
        "--device",
        "cpu",
        "--num-pages",
        "64",
        "--max-model-len",
        "64",
        "--served-model-name",
        "cli-tiny",
        "--uvicorn-log-level",
        "info",
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    startup: list[str] = []
    try:
        port = _wait_for_port(process, seen=startup)
        # loaded: what the process holds for good is out of the garbage collector's scans (engine/gc_heap.py)
        assert any(re.search(r"diffuserve serve: \d+ objects frozen", line) for line in startup)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="env-key", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["cli-tiny"]
        assert client.models.list().data[0].max_model_len == 64
        assert client.completions.create(model="cli-tiny", prompt="hi", max_tokens=4).usage.completion_tokens <= 4
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        stderr = process.communicate(timeout=30)[1]
    assert "Application shutdown complete" in stderr and process.returncode == 0  # Ctrl-C: a graceful stop


def test_config_errors_are_one_line(capsys, tiny_model_dir: Path):
    assert main(["serve", str(tiny_model_dir), "--max-waiting-requests", "0"]) == 2
    error = capsys.readouterr().err
    assert error == "diffuserve serve: error: max_waiting_requests: got 0, must be >= 1\n"
    assert main(["serve", str(tiny_model_dir), "--uvicorn-log-level", "loud"]) == 2
    assert "uvicorn_log_level" in capsys.readouterr().err


def test_a_busy_port_fails_before_the_model_loads(capsys, tiny_model_dir: Path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the model was loaded although the port is busy")

    monkeypatch.setattr("diffuserve.engine.llm_engine.LLMEngine.__init__", never)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        assert main(["serve", str(tiny_model_dir), "--port", str(port)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"diffuserve serve: error: port: cannot listen on 127.0.0.1:{port}") and "--port" in error
    assert error.count("\n") == 1 and time.monotonic() - started < 5


def test_usage_hint_is_self_contained():
    hint = usage_hint(ServerConfig(served_model_name="m", api_key="secret"), 8123)
    assert "examples/" not in hint and "secret" not in hint
    assert "http://127.0.0.1:8123/v1" in hint and "from openai import OpenAI" in hint
    assert "os.environ['DIFFUSERVE_API_KEY']" in hint
    assert "web console: http://127.0.0.1:8123/" in hint
    assert "web console" not in usage_hint(ServerConfig(served_model_name="m", no_web_console=True), 8123)


def test_serve_a_hub_id_offline_and_sigterm_drains_for_at_most_the_shutdown_timeout(
    tmp_path: Path, tiny_model_dir: Path
):
    populate_hub_cache(tmp_path / "hub", "org/tiny", tiny_model_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "OMP_NUM_THREADS": "1"}
    env.pop("DIFFUSERVE_API_KEY", None)
    command = [
        sys.executable,
        "-m",
        "diffuserve",
        "serve",
        "org/tiny",
        "--port",
        "0",
        "--device",
        "cpu",
        "--num-pages",
        "80",
        "--max-model-len",
        "1024",
        "--shutdown-timeout",
        "1",
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port = _wait_for_port(process)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["org/tiny"]
        long = {
            "model": "org/tiny",
            "prompt": "Once upon 4",
            "max_tokens": 1000,
            "ignore_eos": True,
            "decoder": "fixed",
            "steps": 4,
            "stream": True,
        }
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=long, timeout=60) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            with pytest.raises(httpx.HTTPError):  # cut at the timeout, long before 1000 tokens
                rest = list(lines)
                raise AssertionError(f"the stream ran to its end: {rest[-2:]}")
        process.wait(timeout=30)
        assert time.monotonic() - signalled < 10
    finally:
        if process.poll() is None:
            process.kill()
        stderr = process.communicate(timeout=30)[1]
    assert "timeout graceful shutdown exceeded" in stderr
