"""Tool calling in the Qwen3 family's format: a call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>` in the reply, tools are offered through the chat template, results come back as `tool` messages.

Owns: turning a request's messages into what the template sees (templates that render `tools` get them as
they are; others get the documented fallback: a system prompt listing the tools, calls written out in the
assistant's content, results as user messages in `<tool_response>` tags); the grammar that enforces
`tool_choice` required / a named function; and parsing calls out of text, whole or while it streams.
Knows nothing of the engine or HTTP.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from diffuserve.server.errors import bad_request
from diffuserve.server.protocol import ChatMessage, NamedToolChoice, Tool

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
CALL_PATTERN = re.compile(re.escape(CALL_START) + r"\s*(.*?)\s*" + re.escape(CALL_END), re.DOTALL)
TOOLS_PROMPT = (
    "# Tools\n\nYou can call the functions below to help answer. Their signatures, one JSON object a line:\n"
    "<tools>\n{tools}\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments "
    "between <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function name>, \"arguments\": "
    "<arguments object>}}\n</tool_call>"
)
"""The system prompt that offers tools to a model whose chat template does not render them."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """JSON text."""


def template_renders_tools(chat_template: Any) -> bool:
    return isinstance(chat_template, str) and "tools" in chat_template


def template_messages(messages: list[dict[str, Any]], tools: list[Tool] | None, renders_tools: bool
                      ) -> list[dict[str, Any]]:
    """`messages` (already role-mapped dicts, tool_calls as OpenAI sends them) as the template should see them."""
    if renders_tools:
        return [_native(m) for m in messages]
    out = [_fallback(m) for m in messages]
    if tools:
        listing = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
        prompt = TOOLS_PROMPT.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _native(message: dict[str, Any]) -> dict[str, Any]:
    """Tool calls with parsed arguments (templates apply `tojson` to them)."""
    if not message.get("tool_calls"):
        return message
    calls = [{"type": "function", "function": {"name": c["function"]["name"],
                                               "arguments": _arguments(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "content": message.get("content") or "", "tool_calls": calls}


def _fallback(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    if not message.get("tool_calls"):
        return {"role": message["role"], "content": message.get("content") or ""}
    calls = [f"{CALL_START}\n" + json.dumps({"name": c["function"]["name"],
                                            "arguments": _arguments(c["function"]["arguments"])}) + f"\n{CALL_END}"
             for c in message["tool_calls"]]
    return {"role": message["role"], "content": "\n".join(filter(None, [message.get("content"), *calls]))}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_messages(messages: list[ChatMessage]) -> None:
    """400 for tool messages without the call they answer, and null content where text is required."""
    for i, m in enumerate(messages):
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers",
                              f"messages[{i}].tool_call_id")
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise bad_request(f"messages[{i}].content: null is only allowed in an assistant message with "
                              "tool_calls", f"messages[{i}].content")
        if m.tool_calls and m.role != "assistant":
            raise bad_request(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                              f"messages[{i}].tool_calls")


def tool_call_grammar(tools: list[Tool] | None, choice: str | NamedToolChoice | None, parallel: bool) -> str | None:
    """The Lark grammar of the reply `choice` forces (None for auto and none): one call, or with `parallel`
    one or more, each naming an offered function with arguments matching its parameter schema."""
    if choice is None or choice in ("auto", "none"):
        return None
    if not tools:
        raise bad_request(f"tool_choice: {choice!r:.60} needs `tools`", "tool_choice")
    chosen = tools
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            names = [t.function.name for t in tools]
            raise bad_request(f"tool_choice: function {choice.function.name!r} is not among tools {names}",
                              "tool_choice")
    schema = {"anyOf": [{
        "type": "object", "additionalProperties": False, "required": ["name", "arguments"],
        "properties": {"name": {"const": t.function.name},
                       "arguments": t.function.parameters or {"type": "object", "properties": {}}},
    } for t in chosen], "x-guidance": {"whitespace_flexible": False}}  # compact JSON: no unbounded whitespace
    call = f'"{CALL_START}\\n" %json {json.dumps(schema)} "\\n{CALL_END}"'
    more = ' ("\\n" call)*' if parallel else ""
    return f"start: call{more}\ncall: {call}\n"


def parse_calls(text: str, final: bool = True) -> tuple[str, list[ParsedCall]]:
    """(content outside complete calls, the calls). Unless `final`, a trailing unclosed call or a suffix that
    may begin one is held back (it is neither content nor a call yet). A block whose JSON is not a call stays
    content."""
    content, calls, end = [], [], 0
    for match in CALL_PATTERN.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue
        content.append(text[end : match.start()])
        calls.append(call)
        end = match.end()
    tail = text[end:]
    if not final:
        tail = tail[: _held_from(tail)]
    content.append(tail)
    return "".join(content), calls


def _held_from(tail: str) -> int:
    """Where the part of `tail` that may still become a call begins."""
    start = tail.find(CALL_START)
    if start >= 0:
        return start
    for k in range(min(len(CALL_START) - 1, len(tail)), 0, -1):
        if CALL_START.startswith(tail[-k:]):
            return len(tail) - k
    return len(tail)


def _call(body: str) -> ParsedCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
