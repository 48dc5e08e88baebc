"""The worker surface a gateway reads, over loopback with httpx: /get_model_info and /get_server_info (and
/model_info, /server_info) carry the settings the server was started with, under SGLang's names; their load
(`internal_states`) and the /metrics gauges llm-d's picker scrapes move with a request in flight; the
`cache_config_info` series names the page size; the state-slot utilisation of a hybrid model is a fraction."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffuserve import __version__
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.server.config import ServerConfig
from tests.server.conftest import API_KEY, LiveServer

LONG = {
    "prompt": "Once upon 4",
    "max_tokens": 400,
    "ignore_eos": True,
    "decoder": "fixed",
    "steps": 4,
    "stream": True,
    "skip_special_tokens": False,
}
"""A long request that streams text from its first block on: past its reply the bundled model writes
<|endoftext|>, which streams only as text when special tokens are kept."""


def _get(server: LiveServer, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.config.api_key}"} if server.config.api_key else {}
    return httpx.get(server.url + path, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def hybrid(single_threaded_torch: None) -> Iterator[LiveServer]:
    """The bundled clover_moe model (GDN state slots + paged K/V), as `diffuserve serve` with no MODEL serves it."""
    config = ServerConfig(served_model_name="bundled")
    server = LiveServer(DEFAULT_MODEL_DIR, config, num_pages=96, max_num_seqs=4, max_model_len=512).start()
    yield server
    server.stop()


def test_model_info_is_the_started_configuration(live_server: LiveServer, tiny_model_dir: Path):
    hf_config = json.loads((tiny_model_dir / "config.json").read_text())
    for path in ("/get_model_info", "/model_info"):
        info = _get(live_server, path).json()
        assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
        assert info["architectures"] == hf_config["architectures"] and info["model_type"] == hf_config["model_type"]
        assert info["context_length"] == 192  # the fixture's max_model_len
        assert info["block_length"] == 4 and info["page_size"] == live_server.engine.pool.page_size
        assert info["vocab_size"] == hf_config["vocab_size"] and info["served_model_name"] == "tiny"
    assert httpx.get(f"{live_server.url}/get_model_info", timeout=30).status_code == 401  # behind the key


def test_server_info_is_the_started_configuration(live_server: LiveServer):
    page_size = live_server.engine.pool.page_size
    for path in ("/get_server_info", "/server_info"):
        info = _get(live_server, path).json()
        assert info["version"] == __version__ and info["served_model_name"] == "tiny"
        assert info["max_running_requests"] == 64 and info["context_length"] == 192
        assert (info["chunked_prefill_size"], info["max_prefill_tokens"]) == (4096, 256)  # the CPU defaults
        assert info["max_total_num_tokens"] == 1024 * page_size  # the fixture's num_pages
        assert (info["tp_size"], info["ep_size"], info["dp_size"]) == (1, 1, 1)
        assert info["disable_radix_cache"] is False and info["num_state_slots"] == 0
        assert len(info["internal_states"]) == 1


def test_load_and_gauges_move_with_a_request_in_flight(hybrid: LiveServer):
    idle = _get(hybrid, "/get_server_info").json()["internal_states"][0]
    assert idle["num_running_reqs"] == 0 and idle["num_waiting_reqs"] == 0
    started, stop = threading.Event(), threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{hybrid.url}/v1/completions", json=LONG, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    started.set()
                if stop.is_set():
                    return

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(60)
        hybrid.wait_for(lambda: hybrid.metric("num_requests_running") == 1)
        busy = _get(hybrid, "/server_info").json()["internal_states"][0]
        slots_total = hybrid.engine.state_pool.num_slots
        assert busy["num_running_reqs"] == 1 and busy["token_usage"] > 0
        assert busy["state_slot_usage"] == pytest.approx(hybrid.metric("state_slots_used") / slots_total)
        assert 0 < hybrid.metric("state_slot_usage_perc") <= 1 and hybrid.metric("kv_cache_usage_perc") > 0
    finally:
        stop.set()
        thread.join(60)
    hybrid.wait_for(lambda: hybrid.metric("num_requests_running") == 0)
    assert hybrid.metric("state_slot_usage_perc") == 0


def test_cache_config_info_names_the_page_size(live_server: LiveServer):
    text = httpx.get(f"{live_server.url}/metrics", timeout=30).text
    line = next(line for line in text.splitlines() if line.startswith("diffuserve:cache_config_info{"))
    assert f'block_size="{live_server.engine.pool.page_size}"' in line and 'num_gpu_blocks="1024"' in line
    assert line.endswith(" 1.0") and API_KEY not in text
