"""Tool calling on the server: checks of tool messages, `tool_choice` as a grammar (required / a named
function), call ids. The format itself (rendering, grammar, parsing) is `diffuserve/text/tool_format.py`'s.
Knows nothing of the engine or HTTP transport.
"""

from __future__ import annotations

import uuid

from diffuserve.server.errors import bad_request
from diffuserve.server.protocol import ChatMessage, NamedToolChoice, Tool
from diffuserve.text.tool_format import call_grammar


def check_messages(messages: list[ChatMessage]) -> None:
    """400 for tool messages without the call they answer, and null content where text is required."""
    for i, m in enumerate(messages):
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(
                f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers",
                f"messages[{i}].tool_call_id",
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise bad_request(
                f"messages[{i}].content: null is only allowed in an assistant message with tool_calls",
                f"messages[{i}].content",
            )
        if m.tool_calls and m.role != "assistant":
            raise bad_request(
                f"messages[{i}].tool_calls: only assistant messages carry tool calls", f"messages[{i}].tool_calls"
            )


def tool_call_grammar(tools: list[Tool] | None, choice: str | NamedToolChoice | None, parallel: bool) -> str | None:
    """The Lark grammar of the reply `choice` forces (None for auto and none); 400 for a choice that names no
    offered tool."""
    if choice is None or choice in ("auto", "none"):
        return None
    if not tools:
        raise bad_request(f"tool_choice: {choice!r:.60} needs `tools`", "tool_choice")
    chosen = tools
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            names = [t.function.name for t in tools]
            raise bad_request(
                f"tool_choice: function {choice.function.name!r} is not among tools {names}", "tool_choice"
            )
    return call_grammar([t.model_dump(exclude_none=True) for t in chosen], parallel)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
