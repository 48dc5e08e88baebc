"""`diffuserve serve` as users run it: a subprocess on 127.0.0.1 with an ephemeral port, the API key from
DIFFUSERVE_API_KEY, engine flags from the command line; and config errors as one line, exit code 2."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from diffuserve.cli import main


def _wait_for_port(process: subprocess.Popen, timeout_s: float = 120) -> int:
    """uvicorn logs the port it bound (port 0 = any free one)."""
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return int(match.group(1))
        assert time.monotonic() < deadline, "the server did not start in time"
    raise AssertionError(f"the server exited with {process.wait()} before listening")


def test_serve_subprocess(tiny_model_dir: Path):
    env = {**os.environ, "DIFFUSERVE_API_KEY": "env-key", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "diffuserve", "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu",
               "--num-pages", "64", "--max-model-len", "64", "--served-model-name", "cli-tiny",
               "--uvicorn-log-level", "info"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port = _wait_for_port(process)
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
