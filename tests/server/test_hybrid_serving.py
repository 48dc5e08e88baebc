"""`diffuserve serve` on a clover_moe directory (hybrid: GDN state slots + paged K/V): completions, streamed or
not, equal the offline API's; echo scoring (lm-eval's loglikelihood request) equals the naive reference; /metrics
shows the state slots; a client that disconnects mid-stream gets its
request aborted and its state slot and pages freed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_scoring import reference_hybrid_prompt_log_probs
from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory) -> Path:
    return write_clover_moe_checkpoint(
        tmp_path_factory.mktemp("hybrid-serve") / "m",
        make_clover_moe_config(block_length=4),
        seed=12,
        init_std=0.1,
        logit_scale=20.0,
    )


@pytest.fixture(scope="module")
def server(hybrid_dir, single_threaded_torch):
    live = LiveServer(hybrid_dir, ServerConfig(served_model_name="hybrid"), max_num_seqs=8, max_model_len=512).start()
    yield live
    live.stop()


def test_completions_equal_the_offline_api_and_metrics_show_the_slots(server, hybrid_dir):
    body = {"model": "hybrid", "prompt": "Hello, world", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    text = server.post("/v1/completions", body).json()["choices"][0]["text"]
    offline = (
        LLM(str(hybrid_dir), device="cpu", max_model_len=512)
        .generate("Hello, world", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
        .outputs[0]
        .text
    )
    assert text == offline
    assert server.metric("state_slots_total") == server.engine.state_pool.num_slots > 0
    assert server.metric("state_slots_used") == 0


def test_echo_scoring_equals_the_naive_reference(server, hybrid_dir):
    prompt = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108]  # three blocks of 4 (logits up to ~30: rel 1e-5)
    body = {"model": "hybrid", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    logprobs = server.post("/v1/completions", body).json()["choices"][0]["logprobs"]
    expected = reference_hybrid_prompt_log_probs(load_model(hybrid_dir)[1], prompt)
    assert logprobs["token_logprobs"][0] is None and len(logprobs["tokens"]) == len(prompt) + 1
    for p in range(1, len(prompt)):
        assert logprobs["token_logprobs"][p] == pytest.approx(float(expected[p][prompt[p]]), rel=1e-5, abs=1e-4)


def test_a_client_disconnect_frees_the_state_slot_and_pages(server):
    engine = server.engine
    free_slots, free_pages = engine.state_pool.num_free_slots, engine.pool.num_free_pages
    body = {
        "model": "hybrid",
        "prompt": "abc " * 20,
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        for _ in response.iter_lines():
            if engine.state_pool.num_used_slots:
                break  # running: leave mid-generation
    server.wait_for(lambda: not engine.has_unfinished_requests())
    server.wait_for(lambda: engine.state_pool.num_free_slots == free_slots)
    assert engine.pool.num_free_pages == free_pages
