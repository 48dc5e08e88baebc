"""Every bad input of the issue, asserted by status code and OpenAI error body: never a 500, never a traceback,
and the field at fault named in `param`."""

from __future__ import annotations

import httpx
import openai
import pytest

from diffuserve.errors import ContextLengthExceeded, InvalidTokenIds, RequestError
from diffuserve.server.config import ServerConfig
from tests.server.conftest import MODEL_NAME, LiveServer

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"prompt": "hi"}

# (path, body, status, param, code, words the message must contain)
CASES = [
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "missing_required_parameter", ["Field required"]),
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "model", "model_not_found", ["gpt-4", MODEL_NAME]),
    ("/v1/completions", {"prompt": "x" * 300}, 400, "prompt", "context_length_exceeded", ["192", "300"]),
    (
        "/v1/completions",
        {"prompt": "x" * 100, "max_tokens": 100},
        400,
        "max_tokens",
        "context_length_exceeded",
        ["192", "200", "100"],
    ),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "invalid_value", ["greater than"]),
    ("/v1/completions", {**COMPLETION, "max_tokens": -5}, 400, "max_tokens", "invalid_value", ["-5"]),
    ("/v1/completions", {**COMPLETION, "max_tokens": "5"}, 400, "max_tokens", "invalid_type", ["integer"]),
    ("/v1/completions", {**COMPLETION, "max_tokens": 2.5}, 400, "max_tokens", "invalid_type", ["integer"]),
    ("/v1/completions", {**COMPLETION, "temperature": -0.5}, 400, "temperature", "invalid_value", ["-0.5"]),
    ("/v1/completions", {**COMPLETION, "temperature": "hot"}, 400, "temperature", "invalid_type", ["number"]),
    ("/v1/completions", {**COMPLETION, "n": 9}, 400, "n", "invalid_value", ["at most 8"]),
    ("/v1/completions", {**COMPLETION, "n": 0}, 400, "n", "invalid_value", ["greater than"]),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, 400, "stream", "invalid_type", ["boolean"]),
    ("/v1/completions", {"prompt": 5}, 400, "prompt", "invalid_type", ["string"]),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", "invalid_value", ["at least 1"]),
    ("/v1/completions", {"prompt": []}, 400, "prompt", "invalid_value", ["at least 1"]),
    ("/v1/completions", {"prompt": 4.5}, 400, "prompt", "invalid_type", ["4.5"]),
    ("/v1/completions", {"prompt": [999999]}, 400, "prompt", "invalid_value", ["999999", "320"]),
    ("/v1/completions", {"prompt": [[5, 6], [-1]]}, 400, "prompt", "invalid_value", ["-1", "320"]),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, 400, "top_p", "invalid_value", ["greater than"]),
    ("/v1/completions", {**COMPLETION, "seed": 2**64}, 400, "seed", "invalid_value", ["less than"]),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, 400, "stop[0]", "invalid_value", ["at least 1"]),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [5000]}, 400, "stop_token_ids", "invalid_value", ["5000"]),
    (
        "/v1/completions",
        {**COMPLETION, "max_tokens": 3, "min_tokens": 5},
        400,
        "min_tokens",
        "invalid_value",
        ["max_tokens"],
    ),
    ("/v1/completions", {**COMPLETION, "decoder": "beam"}, 400, "decoder", "invalid_value", ["threshold"]),
    ("/v1/completions", {**COMPLETION, "threshold": 2}, 400, "threshold", "invalid_value", ["less than"]),
    (
        "/v1/completions",
        {**COMPLETION, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "invalid_value",
        ["stream"],
    ),
    ("/v1/completions", {**COMPLETION, "logprobs": 21}, 400, "logprobs", "invalid_value", ["less than or equal", "20"]),
    ("/v1/completions", {**COMPLETION, "logprobs": True}, 400, "logprobs", "invalid_type", ["integer"]),
    ("/v1/completions", {**COMPLETION, "suffix": "end"}, 400, "suffix", "unsupported_parameter", ["not supported"]),
    ("/v1/completions", {**COMPLETION, "best_of": 3}, 400, "best_of", "unsupported_parameter", ["best_of"]),
    (
        "/v1/completions",
        {**COMPLETION, "presence_penalty": 2.5},
        400,
        "presence_penalty",
        "invalid_value",
        ["less than or equal to 2"],
    ),
    (
        "/v1/completions",
        {**COMPLETION, "logit_bias": {"5": 10}},
        400,
        "logit_bias",
        "unsupported_parameter",
        ["not supported"],
    ),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "invalid_value", ["at least 1"]),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", "invalid_type", ["list"]),
    (
        "/v1/chat/completions",
        {**CHAT, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        "invalid_value",
        ["greater than"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 300}]},
        400,
        "messages",
        "context_length_exceeded",
        ["192"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "tool", "content": "4"}]},
        400,
        "messages[0].tool_call_id",
        "invalid_value",
        ["tool message"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "4"}]},
        400,
        "messages[0].role",
        "invalid_value",
        ["robot", "'user'"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
        400,
        "messages[0].content[0].type",
        "invalid_value",
        ["image_url", "'text'"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user"}]},
        400,
        "messages[0].content",
        "missing_required_parameter",
        ["Field required"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]},
        400,
        "messages[0].tool_calls[0].function",
        "missing_required_parameter",
        ["Field required"],
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": None}]},
        400,
        "messages[0].content",
        "invalid_value",
        ["null"],
    ),
    ("/v1/chat/completions", {**CHAT, "logprobs": 1}, 400, "logprobs", "invalid_type", ["boolean"]),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value", ["logprobs: true"]),
    (
        "/v1/chat/completions",
        {**CHAT, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "invalid_value",
        ["20"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "tool_choice": "required"},
        400,
        "tool_choice",
        "invalid_value",
        ["needs `tools`"],
    ),
    (
        "/v1/chat/completions",
        {
            **CHAT,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
        "invalid_value",
        ["'g'", "['f']"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "response_format": {"type": "json_schema"}},
        400,
        "response_format",
        "invalid_value",
        ["json_schema"],
    ),
    (
        "/v1/chat/completions",
        {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
        },
        400,
        "structured_outputs.json",
        "invalid_value",
        ["frobnicate"],
    ),
    (
        "/v1/completions",
        {**COMPLETION, "guided_regex": "[a-"},
        400,
        "structured_outputs.regex",
        "invalid_value",
        ["unclosed character class"],
    ),
    (
        "/v1/completions",
        {**COMPLETION, "guided_regex": "a", "guided_choice": ["a"]},
        400,
        "guided_choice",
        "invalid_value",
        ["guided_regex"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "chat_template_kwargs": {"tokenize": True}},
        400,
        "chat_template_kwargs",
        "invalid_value",
        ["tokenize"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "continue_final_message": True},
        400,
        "continue_final_message",
        "invalid_value",
        ["add_generation_prompt"],
    ),
    ("/tokenize", {}, 400, "prompt", "invalid_value", ["exactly one"]),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens", "invalid_value", ["-1"]),
    ("/v1/nothing-here", {}, 404, None, "not_found", ["Not Found"]),
]


def _check_error(response: httpx.Response, status: int, param: str | None, code: str, words: list[str]) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], (word, error["message"])
    assert "Traceback" not in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code", "words"),
    CASES,
    ids=[f"{c[0]}-{c[3]}-{c[4]}-{i}" for i, c in enumerate(CASES)],
)
def test_bad_input_is_an_openai_error(live_server: LiveServer, path, body, status, param, code, words):
    _check_error(live_server.post(path, body), status, param, code, words)


@pytest.mark.parametrize(
    ("path", "content", "param", "code", "words"),
    [
        ("/v1/completions", b'{"prompt": ', None, "invalid_json", ["not valid JSON"]),
        ("/v1/completions", b"[1, 2]", None, "invalid_json", ["JSON object"]),
        ("/v1/completions", b"", None, "invalid_json", ["JSON object"]),
        ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "temperature", "invalid_value", ["finite"]),
        ("/v1/completions", b'{"prompt": "\\ud800"}', "prompt", "invalid_value", ["unicode"]),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages",
            "invalid_value",
            ["Unicode"],
        ),
        ("/tokenize", b'{"prompt": "\\ud800"}', "prompt", "invalid_value", ["Unicode"]),
    ],
)
def test_malformed_json_and_text_are_400s(live_server: LiveServer, path, content, param, code, words):
    """Raw bodies: what a JSON encoder would refuse to produce (bad syntax, NaN, lone UTF-16 surrogates)."""
    _check_error(live_server.post(path, content=content), 400, param, code, words)


def test_wrong_method_is_a_405(live_server: LiveServer):
    response = httpx.get(f"{live_server.url}/v1/completions", headers={"Authorization": "Bearer test-key"})
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_openai_client_raises_typed_errors(live_server: LiveServer):
    client = live_server.client()
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="hi")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x" * 500}])
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        live_server.client(api_key="wrong").models.list()


def test_unknown_fields_are_ignored_like_vllm(live_server: LiveServer):
    response = live_server.post("/v1/completions", {**COMPLETION, "max_tokens": 4, "not_a_field": 1})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] <= 4


@pytest.mark.parametrize(
    "error",
    [
        ContextLengthExceeded(
            "prompt", "12 tokens leave no room to generate within max_model_len 8; shorten the prompt"
        ),
        InvalidTokenIds("stop_token_ids", "[5000] are not token ids of this model (0 <= id < 320)"),
        RequestError(None, "the engine refuses this request"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("stream", [False, True])
def test_engine_request_errors_are_400s_with_their_param_and_code(live_server: LiveServer, monkeypatch, error, stream):
    """The engine is the authority on context length, token ids and stop tokens: its typed refusal reaches the
    client as-is, before any stream starts."""

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(live_server.engine, "add_request", refuse)
    _check_error(
        live_server.post("/v1/completions", {**COMPLETION, "stream": stream}),
        400,
        error.param,
        error.code,
        [str(error)],
    )


def test_engine_context_errors_keep_their_code(tiny_model_dir, single_threaded_torch):
    """A request within max_model_len that the KV cache can never hold: the engine's ContextLengthExceeded
    reaches the client as a 400 with its param and code (the server's own context check passes it)."""
    config = ServerConfig(served_model_name=MODEL_NAME)
    server = LiveServer(tiny_model_dir, config, num_pages=2, max_model_len=192).start()  # 2 pages of 16 tokens
    try:
        with pytest.raises(openai.BadRequestError) as error:
            server.client().completions.create(model=MODEL_NAME, prompt=[5] * 20, max_tokens=40)
        assert (error.value.body["code"], error.value.body["param"]) == ("context_length_exceeded", "max_tokens")
        assert "need 4 KV pages of 16 tokens, the cache has 2" in error.value.body["message"]
        assert server.client().completions.create(model=MODEL_NAME, prompt=[5] * 4, max_tokens=4).choices
    finally:
        server.stop()
