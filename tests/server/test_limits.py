"""Nothing a client sends can stall the server: a huge body is refused before it is read (413), a prompt too long
for the context is refused from its length before it is tokenized, and large prompts are tokenized off the event
loop, so that other clients' streams keep receiving frames meanwhile. And the right codes: 400 for a request that
could never be admitted, 401 before any body parsing, `invalid_json` for every unreadable body."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffuserve.server.config import ServerConfig
from diffuserve.server.guards import default_max_request_bytes
from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer, sse_events

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# One token per forward and long: a steady stream of frames for as long as the test needs.
STREAM = {
    "model": MODEL_NAME,
    "prompt": "Once upon 4",
    "ignore_eos": True,
    "decoder": "fixed",
    "steps": 4,
    "stream": True,
}
TEN_MB = 10_000_000


STEP_PAUSE_S = 0.01
"""Each engine step of the watched server is made this much slower, so that the stream (one token per step)
lasts seconds whatever the machine's speed: long enough to span the request under test."""


class FrameGaps:
    """Streams a long completion on a thread and records the largest gap between its frames."""

    def __init__(self, server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.server, self.times, self.started = server, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        step = server.engine.step

        def paced_step():
            time.sleep(STEP_PAUSE_S)  # sleeping releases the GIL: it slows the engine, not the event loop
            return step()

        monkeypatch.setattr(server.engine, "step", paced_step)

    def _run(self) -> None:
        body = {**STREAM, "max_tokens": self.server.serving.max_model_len - 16}
        with httpx.stream(
            "POST", f"{self.server.url}/v1/completions", json=body, headers=AUTH, timeout=120
        ) as response:
            for event in sse_events(response):
                self.times.append(time.monotonic())
                self.started.set()
                if event == "[DONE]":
                    return

    def __enter__(self) -> FrameGaps:
        self._thread.start()
        assert self.started.wait(60), "the stream did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(120)

    def largest_gap_during(self, start: float, end: float) -> float:
        """The largest gap between frames that overlaps [start, end] (call it once the stream ended; the stream
        must have outlived `end`)."""
        assert self.times[-1] > end, "the stream ended before the request under test was answered"
        return max(b - a for a, b in zip(self.times, self.times[1:]) if b >= start and a <= end)


@pytest.fixture()
def big_body_server(tiny_model_dir: Path, single_threaded_torch: None) -> Iterator[LiveServer]:
    """Accepts bodies up to 64 MB, so that a 10 MB prompt reaches the prompt checks; a 512-token context, so
    that a stream lasts long enough to watch."""
    config = ServerConfig(api_key=API_KEY, served_model_name=MODEL_NAME, max_request_bytes=64_000_000)
    server = LiveServer(tiny_model_dir, config, num_pages=128, max_model_len=512).start()
    yield server
    server.stop()


def _timed_post(server: LiveServer, body: dict, **kwargs) -> tuple[httpx.Response, float, float]:
    start = time.monotonic()
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=120, **kwargs)
    return response, start, time.monotonic()


def test_10mb_body_is_a_413_before_it_is_read_and_streams_keep_flowing(live_server: LiveServer, monkeypatch):
    assert default_max_request_bytes(192) < TEN_MB
    with FrameGaps(live_server, monkeypatch) as stream:
        response, start, end = _timed_post(live_server, {"model": MODEL_NAME, "prompt": "x" * TEN_MB})
    gap = stream.largest_gap_during(start, end)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"
    assert "--max-request-bytes" in response.json()["error"]["message"]
    assert end - start < 1.0 and gap < 2.0, (end - start, gap)


def test_10mb_prompt_is_refused_from_its_length_and_streams_keep_flowing(big_body_server: LiveServer, monkeypatch):
    server = big_body_server
    with FrameGaps(server, monkeypatch) as stream:
        response, start, end = _timed_post(server, {"model": MODEL_NAME, "prompt": "x" * TEN_MB})
    gap = stream.largest_gap_during(start, end)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert f"{TEN_MB} characters" in error["message"] and "512 tokens" in error["message"]
    assert end - start < 1.0 and gap < 2.0, (end - start, gap)


def test_large_prompts_are_tokenized_off_the_event_loop(big_body_server: LiveServer, monkeypatch):
    """Without a length bound (a tokenizer that may merge text), a 2 MB prompt is tokenized: on the worker
    thread, while the stream keeps going."""
    server = big_body_server
    monkeypatch.setattr(server.serving.tokenizer, "min_num_tokens", lambda num_chars: 0)
    with FrameGaps(server, monkeypatch) as stream:
        response, start, end = _timed_post(server, {"model": MODEL_NAME, "prompt": "ab" * 1_000_000})
    gap = stream.largest_gap_during(start, end)
    assert response.status_code == 400 and "2000000 tokens" in response.json()["error"]["message"]
    assert gap < 1.5, gap


def test_chunked_body_over_the_limit_is_a_413(live_server: LiveServer):
    """No Content-Length: the body is counted as it arrives."""
    limit = default_max_request_bytes(192)

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    response = httpx.post(
        f"{live_server.url}/v1/completions",
        content=chunks(),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_auth_comes_before_the_body(live_server: LiveServer):
    for content in (b'{"prompt": ', b"x" * (2 << 20)):
        response = httpx.post(f"{live_server.url}/v1/completions", content=content, timeout=30)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{live_server.url}/v1/nothing-here", timeout=30).status_code == 401
    assert httpx.get(f"{live_server.url}/health", timeout=30).status_code == 200


@pytest.mark.parametrize("content", [b'{"prompt": "\xff\xfe"}', b"\x80abc", b'{"prompt": "caf\xe9"}'])
def test_non_utf8_body_is_invalid_json(live_server: LiveServer, content: bytes):
    response = live_server.post("/v1/completions", content=content)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    assert "UTF-8" in response.json()["error"]["message"]


def test_more_sequences_than_the_queue_holds_is_a_400(live_server: LiveServer):
    """600 prompts on an idle server (the queue holds 512): never admissible, so not a retryable 429."""
    response = live_server.post("/v1/completions", {"model": MODEL_NAME, "prompt": ["hi"] * 600, "max_tokens": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "request_too_large")
    assert "512" in error["message"] and "--max-waiting-requests" in error["message"]
    response = live_server.post("/v1/completions", {"model": MODEL_NAME, "prompt": ["hi"] * 100, "n": 8})
    assert response.status_code == 400 and "800 sequences" in response.json()["error"]["message"]
    assert live_server.metric("num_requests_waiting") == 0


@pytest.fixture()
def few_pages_server(tiny_model_dir: Path, single_threaded_torch: None) -> Iterator[LiveServer]:
    """A KV cache of 4 pages (64 tokens) under a 192-token context."""
    server = LiveServer(
        tiny_model_dir, ServerConfig(served_model_name=MODEL_NAME), num_pages=4, page_size=16, max_model_len=192
    ).start()
    yield server
    server.stop()


def test_a_request_needing_more_pages_than_exist_is_a_400(few_pages_server: LiveServer):
    response = few_pages_server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 100})
    assert response.status_code == 400, response.text
    assert "KV pages" in response.json()["error"]["message"]
    assert "--num-pages" in response.json()["error"]["message"]


def _rss_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident set size from /proc")
def test_memory_returns_after_large_prompts(big_body_server: LiveServer):
    """Refused 10 MB prompts (from their length) and 1 MB ones (tokenized, then refused) leave nothing behind.
    A first round sets the allocator's high-water mark; two more rounds (44 MB of prompts each) must not grow the
    process (server and client alike) by more than 32 MB: what a request kept would show up twice. It once grew
    by ~550 MB for one such request and kept it."""
    server = big_body_server

    def round_of_large_prompts() -> int:
        for prompt in ["x" * TEN_MB] * 4 + ["ab " * 350_000] * 4:
            response, _, _ = _timed_post(server, {"model": MODEL_NAME, "prompt": prompt})
            assert response.status_code == 400, response.text
        gc.collect()
        return _rss_bytes()

    first = round_of_large_prompts()
    round_of_large_prompts()
    assert round_of_large_prompts() - first < 32 << 20, (first, _rss_bytes())
