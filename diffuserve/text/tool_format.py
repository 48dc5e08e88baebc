"""The Qwen3 family's tool-call format, shared by the server and the offline API: a call is
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` in the reply.

Owns: what a chat template sees of tools, calls and results (templates that render `tools` get them as they are;
others get the documented fallback: a system prompt listing the tools, calls written out in the assistant's
content, results as user messages in `<tool_response>` tags); the Lark grammar of a reply that must call one of
given tools; and parsing calls out of text, whole or while it streams. Tools are OpenAI's dicts
({"type": "function", "function": {"name", "parameters", ...}}). Knows nothing of the engine or HTTP.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""Calls are written as `{"name": "f", "arguments": {"x": 1}}`: no other whitespace, so none can run on."""
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
CALL_PATTERN = re.compile(re.escape(CALL_START) + r"\s*(.*?)\s*" + re.escape(CALL_END), re.DOTALL)
TOOLS_PROMPT = (
    "# Tools\n\nYou can call the functions below to help answer. Their signatures, one JSON object a line:\n"
    "<tools>\n{tools}\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments "
    'between <tool_call></tool_call> tags:\n<tool_call>\n{{"name": <function name>, "arguments": '
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


def template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, renders_tools: bool
) -> list[dict[str, Any]]:
    """`messages` (already role-mapped dicts, tool_calls as OpenAI sends them) as the template should see them."""
    if renders_tools:
        return [_native(m) for m in messages]
    out = [_fallback(m) for m in messages]
    if tools:
        listing = "\n".join(json.dumps(t) for t in tools)
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
    calls = [
        {
            "type": "function",
            "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])},
        }
        for c in message["tool_calls"]
    ]
    return {**message, "content": message.get("content") or "", "tool_calls": calls}


def _fallback(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    if not message.get("tool_calls"):
        return {"role": message["role"], "content": message.get("content") or ""}
    calls = [
        f"{CALL_START}\n"
        + json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])})
        + f"\n{CALL_END}"
        for c in message["tool_calls"]
    ]
    return {"role": message["role"], "content": "\n".join(filter(None, [message.get("content"), *calls]))}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def call_grammar(tools: list[dict[str, Any]], parallel: bool) -> str:
    """The Lark grammar of a reply made of one call (with `parallel`, one or more) of `tools`, each naming one
    of them with arguments matching its parameter schema."""
    schema = {
        "anyOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "arguments"],
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": t["function"].get("parameters") or {"type": "object", "properties": {}},
                },
            }
            for t in tools
        ],
        "x-guidance": JSON_FORMAT,
    }
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
