"""Faults and limits: a client that disconnects (mid-stream, or while waiting for a whole answer) aborts its
request and frees its pages; an exception inside an engine step fails that step's requests and the server keeps
serving; the engine loop itself crashing fails every open request and turns /health and new requests into 503;
a full waiting queue answers 429 with Retry-After."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from diffuserve.server.config import ServerConfig
from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer, sse_events

# One token per forward, far from the end: still running whenever the test looks. (This prompt's answer starts
# with printable text, so its first blocks are streamed at once rather than held back as incomplete UTF-8.)
LONG = {
    "model": MODEL_NAME,
    "prompt": "Once upon 4",
    "max_tokens": 150,
    "ignore_eos": True,
    "decoder": "fixed",
    "steps": 4,
}


def _assert_aborted_and_freed(server: LiveServer, aborted_before: float, generated_before: float) -> None:
    server.wait_for(lambda: server.metric("request_success_total", finished_reason="abort") == aborted_before + 1)
    server.wait_for(lambda: server.metric("num_requests_running") == 0)
    assert server.metric("kv_cache_usage_perc") == 0
    assert server.metric("generation_tokens_total") - generated_before < LONG["max_tokens"], "it ran to the end"


def test_disconnect_mid_stream_aborts_and_frees_pages(live_server: LiveServer):
    aborted, generated = (
        live_server.metric("request_success_total", finished_reason="abort"),
        live_server.metric("generation_tokens_total"),
    )
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", f"{live_server.url}/v1/completions", json={**LONG, "stream": True}, headers=headers, timeout=60
    ) as response:
        events = sse_events(response)  # kept referenced: dropping the iterator closes the connection
        assert next(events)["choices"][0]["text"]
        assert live_server.metric("kv_cache_usage_perc") > 0
    _assert_aborted_and_freed(live_server, aborted, generated)


def test_disconnect_while_waiting_for_a_whole_answer_aborts(live_server: LiveServer):
    aborted, generated = (
        live_server.metric("request_success_total", finished_reason="abort"),
        live_server.metric("generation_tokens_total"),
    )
    body = json.dumps(LONG).encode()
    host, port = live_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        live_server.wait_for(lambda: live_server.metric("num_requests_running") == 1)
    _assert_aborted_and_freed(live_server, aborted, generated)
    bridge = live_server.serving.bridge  # it forgot the request (a whole answer's: first output handed over)
    live_server.wait_for(lambda: not bridge._unstarted_final and not bridge._routes)


def test_step_failure_fails_its_requests_and_the_server_keeps_serving(live_server: LiveServer, monkeypatch):
    runner = live_server.engine.runner
    execute = runner.execute
    faults = {"left": 0}

    def execute_or_fail(scheduled, beside=None):
        if faults["left"]:
            faults["left"] -= 1
            raise RuntimeError("injected fault")
        return execute(scheduled, beside)

    monkeypatch.setattr(runner, "execute", execute_or_fail)
    client = live_server.client()
    errors_before = live_server.metric("request_success_total", finished_reason="error")
    faults["left"] = 1
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model=MODEL_NAME, prompt="boom", max_tokens=8)
    assert failed.value.status_code == 500
    assert failed.value.body["code"] == "engine_error" and "injected fault" in failed.value.body["message"]
    faults["left"] = 1
    with pytest.raises(openai.APIError, match="injected fault"):
        list(
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "boom"}], max_tokens=8, stream=True
            )
        )
    assert live_server.metric("request_success_total", finished_reason="error") == errors_before + 2
    after = client.completions.create(
        model=MODEL_NAME, prompt="still here", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert after.choices[0].finish_reason == "length" and after.usage.completion_tokens == 8
    assert httpx.get(f"{live_server.url}/health").status_code == 200
    assert live_server.metric("kv_cache_usage_perc") == 0


@pytest.fixture()
def one_seat_server(tiny_model_dir: Path, single_threaded_torch: None):
    """One sequence per step and room for one waiting request; no API key."""
    server = LiveServer(
        tiny_model_dir,
        ServerConfig(max_waiting_requests=1, served_model_name=MODEL_NAME),
        num_pages=64,
        max_num_seqs=1,
        max_model_len=192,
    ).start()
    yield server
    server.stop()


def test_full_waiting_queue_is_a_429_with_retry_after(one_seat_server: LiveServer, monkeypatch):
    server = one_seat_server
    short = {"model": MODEL_NAME, "prompt": "b", "max_tokens": 4}
    step = server.engine.step

    def paced_step():
        time.sleep(0.05)  # the running request outlives the others' round trips, however loaded the machine
        return step()

    monkeypatch.setattr(server.engine, "step", paced_step)
    with ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as running:
            events = sse_events(running)
            next(events)  # the only seat is taken
            waiting = pool.submit(server.post, "/v1/completions", short)
            server.wait_for(lambda: server.metric("num_requests_waiting") == 1)
            rejected = server.post("/v1/completions", short)
            assert rejected.status_code == 429 and rejected.headers["Retry-After"] == "1"
            assert rejected.json()["error"] == {
                "message": "the server's waiting queue is full (1 requests); retry later",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            }
            with pytest.raises(openai.RateLimitError):
                server.client().completions.create(**short)
        # Leaving the stream aborted the running request: the waiting one gets the seat.
        assert waiting.result().status_code == 200
    assert server.metric("requests_rejected_total", reason="queue_full") == 2
    assert server.client(api_key="any key works without --api-key").completions.create(**short).choices


@pytest.fixture()
def doomed_server(tiny_model_dir: Path, single_threaded_torch: None):
    """A server of its own, for a test that kills its engine loop; no API key."""
    server = LiveServer(
        tiny_model_dir, ServerConfig(served_model_name=MODEL_NAME), num_pages=64, max_model_len=192
    ).start()
    yield server
    server.stop()


def test_engine_loop_crash_fails_open_requests_and_answers_503(doomed_server: LiveServer, monkeypatch):
    server = doomed_server
    step = server.engine.step
    crash = {"now": False}

    def step_or_crash():
        if crash["now"]:
            raise RuntimeError("injected loop crash")
        return step()

    # LLMEngine.step fails a step's requests itself when the forward raises; raising from step() instead is the
    # engine loop's own failure, which nothing inside the engine catches.
    monkeypatch.setattr(server.engine, "step", step_or_crash)
    assert httpx.get(f"{server.url}/health").status_code == 200
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as open_:
        events = sse_events(open_)
        assert next(events)["choices"][0]["text"]
        crash["now"] = True
        rest = list(events)
    assert rest[-1] == "[DONE]" and rest[-2]["error"]["code"] == "engine_unavailable"
    assert "injected loop crash" in rest[-2]["error"]["message"]
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
    with pytest.raises(openai.InternalServerError) as refused:
        server.client().completions.create(model=MODEL_NAME, prompt="anyone?", max_tokens=4)
    assert refused.value.status_code == 503 and refused.value.body["code"] == "engine_unavailable"
    streamed = server.post(
        "/v1/chat/completions",
        {"model": MODEL_NAME, "stream": True, "messages": [{"role": "user", "content": "anyone?"}]},
    )
    assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "engine_unavailable"
