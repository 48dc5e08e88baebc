"""`diffuserve serve --replicas 2 --gateway smg` as users run it: the one command brings up two bundled-model
replicas and the gateway; a replica SIGKILLed with 32 requests in flight hangs no request and gives no half-JSON,
requests sent once the gateway marks it down all succeed, the launcher restarts it and it gets traffic again;
SIGTERM stops everything (no process left). Also the launcher's pure parts: the flags each replica gets, the GPUs
each replica sees, the gateway command lines."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from diffuserve.cli.main import main
from diffuserve.server.gateways import GatewaySpec, gateway_command
from diffuserve.server.replicas import gpu_slices, replica_flags
from tests.server.gateway_harness import ENV, Server, assert_no_strays, family, gateway_binary

MODEL = "default-model"
LONG = {"max_tokens": 160, "extra_body": {"ignore_eos": True}}


class Launcher:
    """The launcher's stdout, read line by line in a thread: replica and gateway addresses and pids."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 180) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if match := re.search(pattern, line):
                    return match
            assert self.process.poll() is None, f"the launcher exited: {self.lines[-5:]}"
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} in {timeout_s} s: {self.lines[-5:]}")


def _outcome(gateway: str, i: int) -> str:
    """One request through the gateway, half of them streamed: ok, a clean error (an HTTP status with an
    OpenAI-shaped body, a connection error, an SSE error frame, a stream that ended early), or `unclean` /
    `hang`."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=90)
    try:
        if i % 2:
            chunks = client.completions.create(model=MODEL, prompt=f"Story {i}:", stream=True, **LONG)  # type: ignore[arg-type]
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
            return "ok" if reasons and reasons[-1] == "length" else "stream_ended_early"
        response = client.completions.create(model=MODEL, prompt=f"Story {i}:", **LONG)  # type: ignore[arg-type]
        return "ok" if response.choices[0].finish_reason == "length" else "unclean"
    except openai.APITimeoutError:
        return "hang"
    except openai.APIStatusError as e:
        return f"http_{e.status_code}" if isinstance(e.body, dict) else "unclean"
    except (openai.APIConnectionError, httpx.TransportError):
        return "connection_error"
    except openai.APIError:
        return "error_event"  # an SSE `error` frame (the gateway's, once the replica's stream broke off)
    except (json.JSONDecodeError, openai.APIResponseValidationError):
        return "unclean"


def _healthy(gateway: str, url: str) -> bool:
    workers = httpx.get(f"{gateway}/workers", timeout=10).json()["workers"]
    return next(w["is_healthy"] for w in workers if w["url"] == url)


@pytest.mark.slow  # the whole deployment, a restart and SIGTERM: about a minute on 2 cores
def test_a_killed_replica_under_load(record_property):
    gateway_binary("smg")
    launcher = Launcher(
        [
            *(sys.executable, "-m", "diffuserve", "serve", "--replicas", "2", "--port", "0", "--device", "cpu"),
            *("--gateway", "smg", "--gateway-policy", "round_robin", "--gateway-health-check-interval", "1"),
            *("--gateway-args", "--health-failure-threshold 1 --health-success-threshold 1 --disable-retries"),
        ]
    )
    pids = {launcher.process.pid}
    try:
        gateway = launcher.wait_for(r"gateway smg \(round_robin\): (\S+) pid")[1]
        victim = launcher.wait_for(r"replica 0: (\S+) pid (\d+)")
        victim_url, victim_pid = victim[1], int(victim[2])
        pids |= family(launcher.process.pid)
        with ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(_outcome, gateway, i) for i in range(32)]
            deadline = time.monotonic() + 60
            while Server(victim_url, None).metric("num_requests_running") < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(victim_pid, signal.SIGKILL)
            in_flight = Counter(f.result(timeout=120) for f in futures)
        deadline = time.monotonic() + 30
        while _healthy(gateway, victim_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        with ThreadPoolExecutor(8) as pool:
            after_down = Counter(pool.map(lambda i: _outcome(gateway, i), range(16)))
        restarted = launcher.wait_for(r"replica 0: \S+ pid (\d+) \(restarted\)")
        pids.add(int(restarted[1]))
        deadline = time.monotonic() + 180
        while not _healthy(gateway, victim_url):
            assert time.monotonic() < deadline, "the restarted replica did not rejoin"
            time.sleep(0.2)
        rejoined = Counter(_outcome(gateway, i) for i in range(6))
        served_by_restarted = Server(victim_url, None).metric("request_success_total")
        pids |= family(launcher.process.pid)
    finally:
        launcher.process.send_signal(signal.SIGTERM)
        code = launcher.process.wait(90)
    counts = {"in_flight": dict(in_flight), "after_down": dict(after_down), "rejoined": dict(rejoined)}
    print(f"replica SIGKILLed under load: {counts}; the restarted replica served {served_by_restarted:.0f}")
    record_property("counts", counts)
    assert in_flight.total() == 32 and not {"hang", "unclean"} & set(in_flight)
    assert after_down == Counter(ok=16) and rejoined == Counter(ok=6) and served_by_restarted >= 1
    assert code == 0
    assert_no_strays(pids)


def test_launcher_errors_are_one_line(capsys, monkeypatch):
    assert main(["serve", "--replicas", "0"]) == 2
    assert capsys.readouterr().err == "diffuserve serve: error: replicas: got 0, must be >= 1\n"
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert main(["serve", "--replicas", "2", "--gateway", "vllm-router"]) == 2
    assert "gateway: vllm-router is not installed; install it with `pip install vllm-router`" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["serve", "--replicas", "2"]) == 2
    assert "cannot run under torchrun" in capsys.readouterr().err


def test_each_replica_gets_the_flags_given():
    args = argparse.Namespace(
        command="serve", model=None, port=0, replicas=2, gateway="smg", max_num_seqs=4, enforce_eager=True, seed=None
    )
    assert replica_flags(args) == ["--enforce-eager", "true", "--max-num-seqs", "4"]


def test_each_replica_sees_its_own_gpus():
    assert gpu_slices(8, 2, 4) == ["0,1,2,3", "4,5,6,7"]
    assert gpu_slices(4, 4, 1) == ["0", "1", "2", "3"]
    assert gpu_slices(2, 2, 2) == [None, None]  # too few: each sees all (a CPU run, or the user's choice)


@pytest.mark.parametrize("name, first", [("smg", ["smg", "launch"]), ("vllm-router", ["vllm-router"])])
def test_gateway_command_lines(name: str, first: list[str]):
    spec = GatewaySpec(name, "0.0.0.0", 8000, 8003, ["http://127.0.0.1:8001", "http://127.0.0.1:8002"], "power_of_two")
    command = gateway_command(spec, name)
    assert command[: len(first)] == first and spec.url == "http://127.0.0.1:8000"
    joined = " ".join(command)
    assert "--worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 --policy power_of_two" in joined
    assert "--port 8000" in joined and "--prometheus-port 8003" in joined
    with pytest.raises(ValueError, match="gateway: got 'nginx'"):
        GatewaySpec("nginx", "h", 1, 2, [])
