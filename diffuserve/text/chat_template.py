"""One chat renderer for the offline API (`LLM.chat`) and the server: OpenAI-shaped messages through the model's
chat template to prompt token ids, so that the same messages become the same tokens both ways.

Owns what the template sees of a conversation (roles it knows under another name, text parts joined, tools and
calls in the Qwen3 format of `tool_format`), which keyword arguments may reach the template, and how the rendered
text is encoded: text in a message that spells a special token (`<|im_end|>`) is plain text, as transformers'
`split_special_tokens` makes it; only the template's own markers are special. The rendered text already holds
them, so no special token is added again (vLLM's convention).

Bad input raises a `RequestError` naming the field (`messages`, `chat_template_kwargs`, ...), which the server
answers as a 400. Knows nothing of HTTP or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from diffuserve.errors import RequestError
from diffuserve.text.tokenizer import Tokenizer
from diffuserve.text.tool_format import template_messages, template_renders_tools

TEMPLATE_ROLES = {"developer": "system"}
"""Roles the chat template sees under another name (OpenAI's `developer` is its newer name for `system`)."""

RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""apply_chat_template's own arguments: template kwargs may only pass variables to the template."""


@dataclass(frozen=True)
class RenderedChat:
    """A conversation through the chat template: its text, and what encoding that text safely needs."""

    tokenizer: Tokenizer
    text: str
    conversation: list[dict[str, Any]]
    """The messages as the template saw them."""
    options: dict[str, Any]
    """The template's arguments (add_generation_prompt, tools, template variables)."""

    def token_ids(self) -> list[int]:
        """The prompt's token ids: spelled special tokens in message text stay plain text."""
        _check_unicode(self.text)
        tokenizer = self.tokenizer
        if not any(tokenizer.spells_special(m["content"] or "") for m in self.conversation):
            return tokenizer.encode(self.text, add_special_tokens=False)
        # The same conversation with its contents defused tells the template's special tokens from spelled ones.
        defused = [{**m, "content": tokenizer.defuse(m["content"] or "")} for m in self.conversation]
        return tokenizer.encode_rendered(self.text, _render(tokenizer, defused, self.options))


def render_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> RenderedChat:
    """`messages` (OpenAI's dicts: `content` text or text parts, assistant `tool_calls`, `tool` results) with
    `tools` (OpenAI's function dicts) through the model's chat template; RequestError for what it cannot render."""
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs or {}))
    if reserved:
        raise RequestError("chat_template_kwargs", f"{reserved} are not template variables")
    if add_generation_prompt and continue_final_message:
        raise RequestError("continue_final_message", "cannot be combined with add_generation_prompt=true")
    renders_tools = template_renders_tools(tokenizer.hf.chat_template)
    conversation = template_messages([_template_message(m) for m in messages], tools, renders_tools)
    options = {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        **(template_kwargs or {}),
    }
    if tools and renders_tools:
        options["tools"] = tools
    return RenderedChat(tokenizer, _render(tokenizer, conversation, options), conversation, options)


def chat_token_ids(
    tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
) -> list[int]:
    """`render_conversation(tokenizer, messages, tools, **kwargs).token_ids()`: a conversation's prompt token ids."""
    return render_conversation(tokenizer, messages, tools, **kwargs).token_ids()


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):  # text parts, as OpenAI sends them
        content = "\n".join(part["text"] for part in content)
    return {**message, "role": TEMPLATE_ROLES.get(message["role"], message["role"]), "content": content}


def _render(tokenizer: Tokenizer, conversation: list[dict[str, Any]], options: dict[str, Any]) -> str:
    try:
        return tokenizer.apply_chat_template(conversation, **options)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise RequestError("messages", f"the model's chat template rejected them: {e}") from e


def _check_unicode(text: str) -> None:
    """Message text must be valid Unicode (JSON allows lone surrogates, "\\ud800", which no tokenizer accepts)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError("messages", f"not valid Unicode ({e.reason} at character {e.start})") from e
