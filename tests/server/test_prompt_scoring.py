"""Prompt scoring through the server, as lm-eval-harness's `local-completions` asks for it (`echo`, `logprobs: 1`,
`max_tokens: 1`, temperature 0, on token ids of context + continuation, with the openai client): the
continuation's summed logprobs (`token_logprobs[ctxlen:-1]`, the last entry being the generated token's) equal the
block chain rule computed by the naive reference, one dense forward per token; `max_tokens: 0` scores only;
vLLM's `prompt_logprobs` field; the streamed echo; and the requests that are refused."""

from __future__ import annotations

import json

import httpx
import pytest

from diffuserve.reference.reference_model import load_reference
from diffuserve.reference.reference_scoring import reference_prompt_log_probs
from tests.server.conftest import MODEL_NAME, LiveServer, sse_events

CONTEXTS = [[72, 101, 108, 108, 111, 44, 32, 119, 111], [5, 9, 13, 17, 21, 25, 29]]
CONTINUATIONS = [[114, 108, 100, 33], [33, 37, 41]]
"""Context + continuation spans three blocks of 4 in both pairs."""


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return load_reference(tiny_model_dir, block_length=4, max_model_len=192)


@pytest.mark.parametrize("max_tokens", [1, 0], ids=["lm-eval", "score-only"])
def test_echo_scoring_of_a_continuation_equals_the_chain_rule(live_server: LiveServer, reference, max_tokens):
    prompts = [c + x for c, x in zip(CONTEXTS, CONTINUATIONS)]
    response = live_server.client().completions.create(
        model=MODEL_NAME, prompt=prompts, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0, seed=1234
    )
    assert response.usage.completion_tokens == max_tokens * len(prompts)
    for choice, prompt, context in zip(sorted(response.choices, key=lambda c: c.index), prompts, CONTEXTS):
        logprobs = choice.logprobs
        assert choice.finish_reason == "length" and len(logprobs.tokens) == len(prompt) + max_tokens
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        expected = reference_prompt_log_probs(reference, prompt)
        continuation = sum(float(expected[p][prompt[p]]) for p in range(len(context), len(prompt)))
        scored = logprobs.token_logprobs[len(context) : len(prompt)]  # lm-eval: [ctxlen:-1]
        assert sum(scored) == pytest.approx(continuation, abs=1e-4)
        assert choice.text == "".join(logprobs.tokens)  # byte tokens: each token's text is one character
        assert logprobs.text_offset == list(range(len(prompt) + max_tokens))
        for p in range(1, len(prompt)):
            top = logprobs.top_logprobs[p]
            assert logprobs.tokens[p] in top and len(top) <= 2
            assert max(top.values()) == pytest.approx(float(expected[p].max()), abs=1e-4)


def test_prompt_logprobs_field_and_generation(live_server: LiveServer, reference):
    prompt = CONTEXTS[0]
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = live_server.post("/v1/completions", body).json()
    scored = live_server.post("/v1/completions", {**body, "prompt_logprobs": 2}).json()
    choice = scored["choices"][0]
    assert choice["text"] == plain["choices"][0]["text"] and choice["logprobs"] is None
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    expected = reference_prompt_log_probs(reference, prompt)
    for p in range(1, len(prompt)):
        entry = entries[p][str(prompt[p])]
        assert entry["logprob"] == pytest.approx(float(expected[p][prompt[p]]), abs=1e-4)
        assert entry["rank"] == 1 + int((expected[p] > expected[p][prompt[p]]).sum())
        assert entry["decoded_token"] == chr(prompt[p])


def test_streamed_echo_sends_the_scored_prompt_first(live_server: LiveServer):
    """The first chunk is the echoed prompt with its scores; the generated tokens' logprobs follow in later
    chunks with text offsets past the prompt's; joined, they are the whole answer's."""
    prompt = CONTEXTS[1] + CONTINUATIONS[1]
    body = {"model": MODEL_NAME, "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 6, "stream": True}
    body.update(temperature=0, ignore_eos=True)
    whole = live_server.post("/v1/completions", {**body, "stream": False}).json()["choices"][0]
    headers = {"Authorization": f"Bearer {live_server.config.api_key}"}
    with httpx.stream("POST", f"{live_server.url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        choices = [event["choices"][0] for event in sse_events(r) if event != "[DONE]"]
    assert choices[0]["text"] == live_server.engine.tokenizer.decode(prompt, False)
    assert len(choices[0]["logprobs"]["tokens"]) == len(prompt) and choices[-1]["finish_reason"] == "length"
    joined = {key: [v for c in choices if c["logprobs"] for v in c["logprobs"][key]] for key in whole["logprobs"]}
    assert "".join(c["text"] for c in choices) == whole["text"] and joined == whole["logprobs"]
    assert all(len(top) == 1 for top in joined["top_logprobs"][1:])  # k = 0: the token itself


def test_a_prompt_that_fills_the_context_can_be_scored(live_server: LiveServer):
    body = {"model": MODEL_NAME, "prompt": [7] * 192, "echo": True, "logprobs": 0, "max_tokens": 0}
    response = live_server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"][0]["logprobs"]["tokens"]) == 192
    generating = {"model": MODEL_NAME, "prompt": [7] * 192, "prompt_logprobs": 0, "max_tokens": 1}
    too_long = live_server.post("/v1/completions", generating)
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"logprobs": 21, "echo": True, "max_tokens": 0}, "logprobs", "invalid_value"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "invalid_value"),
        ({"prompt_logprobs": True}, "prompt_logprobs", "invalid_type"),
    ],
)
def test_refused_scoring_requests(live_server: LiveServer, fields, param, code):
    response = live_server.post("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", **fields})
    error = response.json()["error"]
    assert response.status_code == 400 and (error["param"], error["code"]) == (param, code), json.dumps(error)


def test_chat_refuses_prompt_logprobs(live_server: LiveServer):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1}
    response = live_server.post("/v1/chat/completions", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_logprobs"
