"""Reasoning and tool-call parsing of chat replies: whole, and streamed in every possible split, the streamed
deltas concatenating to the whole message; and the fallback rendering of tools for templates without them."""

from __future__ import annotations

import json

import pytest

from diffuserve.server.chat_output import ChatDeltas, ChatOutputFormat
from diffuserve.server.protocol import Tool
from diffuserve.server.reasoning import split_reasoning, template_thinks
from diffuserve.text.tool_format import TOOLS_PROMPT, parse_calls, template_messages

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
REPLIES = [
    "<think>let me see</think>\n\nthe answer",
    "plain answer",
    f"<think>hmm <tool</think>\n{CALL}",
    f"intro {CALL}\n{CALL} outro",
    "<think>never closed",
    "<tool_call>\nnot json\n</tool_call> tail",
    "a <tool_ca",
    f"\n\n  spaced  \n{CALL}\n\n",
]


def _streamed(fmt: ChatOutputFormat, text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    state = ChatDeltas(fmt)
    reasoning, content, calls = "", "", []
    for end in [*cuts, len(text)]:
        delta = state.delta(text[:end], final=end == len(text))
        if delta is None:
            continue
        reasoning += delta.reasoning_content or ""
        content += delta.content or ""
        calls += [(c.function.name or "", c.function.arguments or "") for c in delta.tool_calls or []]
    return reasoning, content, calls


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize(
    "fmt", [ChatOutputFormat(thinking=True, tools=True), ChatOutputFormat(tools=True), ChatOutputFormat(thinking=True)]
)
def test_streamed_deltas_add_up_to_the_whole_message(fmt, text):
    reasoning, content, calls = fmt.parse(text)
    whole = [(c.name, c.arguments) for c in calls]
    for step in (1, 3, 7):
        streamed = _streamed(fmt, text, list(range(step, len(text), step)))
        assert streamed == (reasoning or "", content, whole), (step, streamed)


def test_whole_message_fields():
    fmt = ChatOutputFormat(thinking=True, tools=True)
    message = fmt.message(f"<think>plan</think>\n\n{CALL}")
    assert message.reasoning_content == "plan" and message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("f", {"x": 1})]
    assert fmt.finish_reason(f"</think>{CALL}", "stop") == "tool_calls"
    assert fmt.finish_reason(CALL, "stop") == "stop"  # thinking, never closed: all reasoning, no call
    assert fmt.finish_reason(f"</think>{CALL}", "length") == "length"
    assert ChatOutputFormat(tools=True, parallel_tool_calls=False).parse(CALL + CALL)[2][1:] == []
    assert ChatOutputFormat().message("x").reasoning_content is None


def test_reasoning_split_and_template_detection():
    assert split_reasoning("<think>a</think>\n\nb") == ("a", "b")
    assert split_reasoning("a</think>b") == ("a", "b")  # templates that open <think> in the prompt
    assert split_reasoning("abc</thi", final=False) == ("abc", "")
    assert template_thinks("...</think>...", None) and not template_thinks("...</think>...", {"enable_thinking": False})
    assert not template_thinks("{{ messages }}", None)


def test_held_back_partial_call_is_content_at_the_end():
    assert parse_calls("a <tool_ca", final=False) == ("a ", [])
    assert parse_calls("a <tool_ca", final=True) == ("a <tool_ca", [])


def test_fallback_rendering_of_tools_calls_and_results():
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    out = template_messages(messages, [tool.model_dump(exclude_none=True)], renders_tools=False)
    assert (
        out[0]["content"].startswith("be brief\n\n# Tools")
        and json.dumps(tool.model_dump(exclude_none=True)) in out[0]["content"]
    )
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}
    native = template_messages(messages, [tool.model_dump(exclude_none=True)], renders_tools=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1} and native[3]["role"] == "tool"
    assert "<tool_call>" in TOOLS_PROMPT
