"""Structured output, tool calling and reasoning through the official `openai` client, on tiny random models
(whose free output is garbage): parsed pydantic objects, tool calls that match their schemas, a full tool round
trip streamed and not, and a chat template that renders tools and thinks."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import jsonschema_rs
import pytest
from pydantic import BaseModel

from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    '{% for c in m.tool_calls or [] %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""A Qwen3-shaped template: renders `tools`, and thinks unless enable_thinking is false."""
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string", "maxLength": 4}, "unit": {"enum": ["c", "f"]}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["zone"],
            "properties": {"zone": {"type": "integer", "minimum": -9, "maximum": 9}},
        },
    },
}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


class Verdict(BaseModel):
    ok: bool
    color: Literal["red", "blue"]


def _server(model: Path) -> LiveServer:
    return LiveServer(model, ServerConfig(served_model_name="tiny"), num_pages=1024, max_model_len=1024).start()


@pytest.fixture(scope="module")
def tools_server(tiny_model_dir: Path, tmp_path_factory, single_threaded_torch: None) -> Iterator[LiveServer]:
    model = tmp_path_factory.mktemp("tools") / "model"
    shutil.copytree(tiny_model_dir, model)
    config_path = model / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": TOOLS_TEMPLATE}))
    server = _server(model)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chatml_server(tiny_model_dir: Path, single_threaded_torch: None) -> Iterator[LiveServer]:
    """The tiny model's own ChatML template, which does not render tools (a long context for the tool prompt)."""
    server = _server(tiny_model_dir)
    yield server
    server.stop()


def test_parse_with_a_pydantic_model_returns_the_object(live_server: LiveServer):
    client = live_server.client()
    for seed in range(3):
        completion = client.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": f"verdict {seed}"}],
            response_format=Verdict,
            max_completion_tokens=48,
            temperature=1.0,
            seed=seed,
        )
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(message.parsed, Verdict)


@pytest.mark.parametrize("field", ["guided_json", "structured_outputs"])
def test_vllm_fields_constrain_completions(live_server: LiveServer, field):
    schema = WEATHER["function"]["parameters"]
    body = {field: schema} if field == "guided_json" else {field: {"json": schema}}
    text = (
        live_server.client()
        .completions.create(model="tiny", prompt="w", max_tokens=48, extra_body=body)
        .choices[0]
        .text
    )
    assert jsonschema_rs.validator_for(schema).is_valid(json.loads(text))


def _check_calls(calls, names: set[str]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert calls
    for call in calls:
        assert call.function.name in names
        assert jsonschema_rs.validator_for(schemas[call.function.name]).is_valid(json.loads(call.function.arguments))


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(tools_server: LiveServer, stream):
    client = tools_server.client()
    messages: list[dict] = [{"role": "user", "content": "weather in Oslo?"}]
    args = dict(model="tiny", tools=[WEATHER, TIME], max_completion_tokens=128, extra_body=NO_THINKING)
    named = {"type": "function", "function": {"name": "get_weather"}}
    if stream:
        calls, finish = _streamed_calls(client, messages, args, named)
    else:
        choice = client.chat.completions.create(
            messages=messages, tool_choice=named, parallel_tool_calls=False, **args
        ).choices[0]
        calls, finish = choice.message.tool_calls, choice.finish_reason
    assert finish == "tool_calls"
    _check_calls(calls, {"get_weather"})
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "12 C"})
    answer = client.chat.completions.create(messages=messages, tool_choice="none", stream=False, **args).choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls in (None, [])
    assert isinstance(answer.message.content, str)


def _streamed_calls(client, messages, args, named):
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(
        messages=messages, tool_choice=named, parallel_tool_calls=False, stream=True, **args
    ):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""

    class Call:
        def __init__(self, c: dict) -> None:
            self.id = c["id"]
            self.function = type("F", (), {"name": c["name"], "arguments": c["arguments"]})

    return [Call(calls[i]) for i in sorted(calls)], finish


def test_required_tool_choice_with_parallel_calls_and_the_fallback_template(chatml_server: LiveServer):
    """A ChatML template does not render tools: they go into a system prompt instead."""
    choice = (
        chatml_server.client()
        .chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "t"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            max_completion_tokens=160,
            temperature=0.0,
        )
        .choices[0]
    )
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls, {"get_weather", "get_time"})


def test_thinking_template_gives_reasoning_content(tools_server: LiveServer):
    """Thinking on (the template's default): the random model never closes `</think>`, so its whole reply is
    reasoning, and the grammar (which starts after `</think>`) never constrains it."""
    client = tools_server.client()
    body = dict(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=12,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    message = client.chat.completions.create(**body).choices[0].message
    assert message.content == "" and len(message.model_extra["reasoning_content"]) > 0
    streamed = "".join(
        c.choices[0].delta.model_extra.get("reasoning_content") or ""
        for c in client.chat.completions.create(stream=True, **body)
        if c.choices
    )
    assert streamed == message.model_extra["reasoning_content"]
    off = client.chat.completions.create(**{**body, "extra_body": {**NO_THINKING, "guided_choice": ["yes", "no"]}})
    assert off.choices[0].message.content in ("yes", "no")
    assert off.choices[0].message.model_extra.get("reasoning_content") is None


def test_a_template_that_renders_tools_gets_them(tools_server: LiveServer):
    client = tools_server.client()
    body = dict(
        model="tiny", messages=[{"role": "user", "content": "q"}], max_completion_tokens=1, extra_body=NO_THINKING
    )
    bare = client.chat.completions.create(**body).usage.prompt_tokens
    offered = client.chat.completions.create(tools=[WEATHER], **body).usage.prompt_tokens
    # byte tokenizer: one token per byte of "Tools:\n<the tool as JSON>\n" inside a system turn
    assert offered - bare >= len(json.dumps(WEATHER))


def test_the_openai_stream_helper_assembles_calls_and_parsed_objects(tools_server: LiveServer):
    client = tools_server.client()
    named = {"type": "function", "function": {"name": "get_time"}}
    with client.chat.completions.stream(
        model="tiny",
        messages=[{"role": "user", "content": "time?"}],
        tools=[WEATHER, TIME],
        tool_choice=named,
        max_completion_tokens=96,
        extra_body=NO_THINKING,
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls, {"get_time"})
    with client.chat.completions.stream(
        model="tiny",
        messages=[{"role": "user", "content": "verdict"}],
        response_format=Verdict,
        max_completion_tokens=48,
        extra_body=NO_THINKING,
    ) as stream:
        parsed = stream.get_final_completion().choices[0].message.parsed
    assert isinstance(parsed, Verdict)
