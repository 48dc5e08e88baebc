"""Reasoning for chat templates that think (`<think> ... </think>`, the Qwen3 family): the reply's text before
`</think>` is `reasoning_content`, the text after it `content`.

A template thinks when it mentions `</think>`; a request turns thinking off with `chat_template_kwargs:
{"enable_thinking": false}` (the template then closes the think block in the prompt, and the whole reply is
content). The reply may open with `<think>` or not (templates that open it in the prompt); a reply that never
closes it (cut by max_tokens) is all reasoning, streamed or not. Knows nothing of the engine or HTTP.
"""

from __future__ import annotations

from typing import Any

THINK_START, THINK_END = "<think>", "</think>"


def template_thinks(chat_template: Any, template_kwargs: dict[str, Any] | None) -> bool:
    """Whether replies to this request are split into reasoning and content."""
    if not isinstance(chat_template, str) or THINK_END not in chat_template:
        return False
    return (template_kwargs or {}).get("enable_thinking", True) is not False


def split_reasoning(text: str, final: bool = True) -> tuple[str, str]:
    """(reasoning, answer). Unless `final`, a suffix that may begin `</think>` (or `<think>` at the start) is
    held back from the reasoning. Newlines between `</think>` and the answer are dropped."""
    if text.startswith(THINK_START):
        text = text[len(THINK_START) :]
    elif not final and THINK_START.startswith(text):
        return "", ""
    end = text.find(THINK_END)
    if end >= 0:
        return text[:end], text[end + len(THINK_END) :].lstrip("\n")
    if not final:
        for k in range(min(len(THINK_END) - 1, len(text)), 0, -1):
            if THINK_END.startswith(text[-k:]):
                return text[:-k], ""
    return text, ""
