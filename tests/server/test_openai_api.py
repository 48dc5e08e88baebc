"""The official openai client against a live server: completions and chat, streamed and not, n > 1, seeds, stop
strings across block boundaries, echo, usage with NFE and TPF, models, tokenizer endpoints.

The tiny random model writes gibberish, but deterministic gibberish: greedy decoding is reproducible, so every
streamed result can be compared with its non-streamed twin.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from diffuserve.sampling_defaults import MASK_DECODER_NAMES
from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer

BLOCK_LENGTH = 4
PROMPTS = ["Once upon 3", "Once upon 4", "zz 0", "Q: 3", "x 5", "The 7"]
FREE = {"ignore_eos": True}


def _usage(usage) -> dict:
    data = usage.model_dump()
    data.pop("prompt_tokens_details")  # cached_tokens depends on what ran before (prefix cache)
    return data


def test_models_health_version(live_server: LiveServer):
    client = live_server.client()
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].max_model_len == 192
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert httpx.get(f"{live_server.url}/health").status_code == 200
    assert httpx.get(f"{live_server.url}/version").json()["version"]


def test_completion_usage_counts_forwards(live_server: LiveServer):
    client = live_server.client()
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=12, extra_body=FREE)
    assert response.choices[0].finish_reason == "length"
    usage = response.usage
    prompt_tokens = live_server.post("/tokenize", {"prompt": PROMPTS[0]}).json()["count"]
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, 12)
    assert usage.total_tokens == prompt_tokens + 12
    # Every block takes at least one forward and at most one per token.
    assert 12 // BLOCK_LENGTH <= usage.num_forwards <= 12 + 1
    assert usage.tokens_per_forward == pytest.approx(12 / usage.num_forwards)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_streamed_completion_equals_non_streamed(live_server: LiveServer, prompt: str):
    client = live_server.client()
    args = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 16, "extra_body": FREE}
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text
    assert sum(1 for t in texts if t) >= 2, "one delta per committed block, not one at the end"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and _usage(chunks[-1].usage) == _usage(whole.usage)


def test_streamed_chat_equals_non_streamed(live_server: LiveServer):
    client = live_server.client()
    args = {
        "model": MODEL_NAME,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}],
        "max_completion_tokens": 16,
        "extra_body": FREE,
    }
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert _usage(chunks[-1].usage) == _usage(whole.usage)


def test_n_and_seed(live_server: LiveServer):
    client = live_server.client()
    args = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "temperature": 5.0,
        "max_tokens": 8,
        "extra_body": FREE,
    }
    first = client.chat.completions.create(**args, seed=1234)
    again = client.chat.completions.create(**args, seed=1234)
    other = client.chat.completions.create(**args, seed=4321)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in again.choices] == texts
    assert [c.message.content for c in other.choices] != texts
    assert len(set(texts)) > 1, "the n completions of one seed are independent draws"
    assert first.usage.completion_tokens == 3 * 8
    streamed = ["", "", ""]
    for chunk in client.chat.completions.create(**args, seed=1234, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts


def _stop_across_a_block_boundary(client) -> tuple[str, str, str]:
    """(prompt, free-running text, stop string) where the stop string's first occurrence straddles two deltas
    of the free-running stream, i.e. two committed blocks."""
    for prompt in PROMPTS:
        stream = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, extra_body=FREE, stream=True)
        parts = [c.choices[0].text for c in stream]
        full = "".join(parts)
        for k in range(1, len(parts)):
            left, right = "".join(parts[:k]), parts[k]
            stop = left[-2:] + right[:2]
            if len(stop) == 4 and "\ufffd" not in stop and full.find(stop) == len(left) - 2:
                return prompt, full, stop
    raise AssertionError("no prompt gives a usable stop string")


def test_stop_string_across_block_boundary(live_server: LiveServer):
    client = live_server.client()
    prompt, full, stop = _stop_across_a_block_boundary(client)
    expected = full[: full.index(stop)]
    args = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 24, "stop": [stop], "extra_body": FREE}
    whole = client.completions.create(**args)
    assert whole.choices[0].text == expected
    assert (whole.choices[0].finish_reason, whole.choices[0].stop_reason) == ("stop", stop)
    parts = [c.choices[0].text for c in client.completions.create(**args, stream=True)]
    assert "".join(parts) == expected
    kept = client.completions.create(**{**args, "extra_body": {**FREE, "include_stop_str_in_output": True}})
    assert kept.choices[0].text == expected + stop


@pytest.mark.parametrize("decoder", MASK_DECODER_NAMES)
def test_every_decoder_is_served(live_server: LiveServer, decoder: str):
    response = live_server.client().completions.create(
        model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=8, extra_body={**FREE, "decoder": decoder}
    )
    assert response.usage.completion_tokens == 8 and response.usage.num_forwards >= 2


def test_the_renoise_decoder_is_a_400_on_a_masked_model(live_server: LiveServer):
    """renoise decodes random-token canvases (DiffusionGemma); this model's blocks are masked."""
    with pytest.raises(openai.BadRequestError) as caught:
        live_server.client().completions.create(
            model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=8, extra_body={**FREE, "decoder": "renoise"}
        )
    assert caught.value.body["param"] == "decoder" and "masked" in caught.value.body["message"]


def test_diffusion_knobs_reach_the_engine(live_server: LiveServer):
    """decoder=fixed with steps=1 accepts a whole block per forward, with steps=4 one token per forward."""
    client = live_server.client()

    def usage(steps: int):
        return client.completions.create(
            model=MODEL_NAME, prompt="abcd", max_tokens=16, extra_body={**FREE, "decoder": "fixed", "steps": steps}
        ).usage

    assert (usage(1).num_forwards, usage(1).tokens_per_forward) == (16 // BLOCK_LENGTH, BLOCK_LENGTH)
    assert (usage(4).num_forwards, usage(4).tokens_per_forward) == (16, 1.0)


def test_echo_several_prompts_and_token_ids(live_server: LiveServer):
    client = live_server.client()
    response = client.completions.create(model=MODEL_NAME, prompt=["ab", "cd"], echo=True, n=2, max_tokens=4)
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert [c.text[:2] for c in response.choices] == ["ab", "ab", "cd", "cd"]
    by_text = client.completions.create(model=MODEL_NAME, prompt="ab", max_tokens=4)
    ids = live_server.post("/tokenize", {"prompt": "ab"}).json()["tokens"]
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=4)
    assert by_ids.choices[0].text == by_text.choices[0].text == response.choices[0].text[2:]
    streamed = ["", "", "", ""]
    for chunk in client.completions.create(
        model=MODEL_NAME, prompt=["ab", "cd"], echo=True, n=2, max_tokens=4, stream=True
    ):
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == [c.text for c in response.choices]


def test_tokenize_detokenize(live_server: LiveServer):
    tokens = live_server.post("/tokenize", {"prompt": "hello"}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 192
    assert live_server.post("/detokenize", {"tokens": tokens["tokens"]}).json() == {"prompt": "hello"}
    chat = live_server.post("/tokenize", {"messages": [{"role": "user", "content": "hello"}]}).json()
    rendered = live_server.post("/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert rendered == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_api_key_is_required_except_on_public_routes(live_server: LiveServer):
    for path in ("/v1/models", "/tokenize"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            response = httpx.request(
                "GET" if path == "/v1/models" else "POST", live_server.url + path, json={"prompt": "x"}, headers=headers
            )
            assert response.status_code == 401
            assert response.json() == {
                "error": {
                    "message": "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
    for path in ("/health", "/version", "/metrics", "/openapi.json"):
        assert httpx.get(live_server.url + path).status_code == 200
    assert live_server.client().models.list().data


def test_metrics_expose_the_diffuserve_names(live_server: LiveServer):
    live_server.client().completions.create(model=MODEL_NAME, prompt="metrics", max_tokens=8)
    text = httpx.get(f"{live_server.url}/metrics").text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_hit_rate",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "num_preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "engine_steps_total",
        "request_success_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket",
        "e2e_request_latency_seconds_bucket",
        "request_queue_time_seconds_bucket",
        "request_prompt_tokens_bucket",
        "request_generation_tokens_bucket",
        "request_num_forwards_bucket",
        "tokens_per_forward_bucket",
        "requests_rejected_total",
    ):
        assert f"diffuserve:{name}" in text, name
    assert live_server.metric("generation_tokens_total") >= 8
    assert live_server.metric("tokens_per_forward_count") >= 1
