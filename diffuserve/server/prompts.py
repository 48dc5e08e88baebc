"""From a request's prompt or messages to token ids: the chat template, tokenization, and the context check.

Completions take text, token ids, or a list of either (one engine request per prompt); chat messages are
rendered with the model's own chat template (text content only) and encoded without adding special tokens
again. A prompt that leaves no room within max_model_len, or an explicit max_tokens that does not fit, is a
400 with both numbers (OpenAI's `context_length_exceeded`). Uses the server's own tokenizer instance, never the
engine's (which lives on the engine-loop thread). Knows nothing of the engine or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2

from diffuserve.server.errors import APIError, bad_request
from diffuserve.server.protocol import ChatCompletionRequest, ChatMessage
from diffuserve.tokenizer import Tokenizer

TEMPLATE_ROLES = {"developer": "system"}
"""Roles the chat template sees under another name (OpenAI's `developer` is its newer name for `system`)."""

RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})
"""apply_chat_template's own arguments: chat_template_kwargs may only pass variables to the template."""


@dataclass(frozen=True)
class Prompt:
    text: str
    """What `echo` returns (the prompt text, or its token ids decoded)."""
    token_ids: list[int]


def completion_prompts(tokenizer: Tokenizer | None, prompt: str | list[str] | list[int] | list[list[int]],
                       vocab_size: int) -> list[Prompt]:
    is_single = isinstance(prompt, str) or isinstance(prompt[0], int)
    items: list[str] | list[list[int]] = [prompt] if is_single else prompt  # type: ignore[assignment,list-item]
    return [_one_prompt(tokenizer, item, vocab_size) for item in items]


def _one_prompt(tokenizer: Tokenizer | None, item: str | list[int], vocab_size: int) -> Prompt:
    if isinstance(item, str):
        if tokenizer is None:
            raise bad_request("prompt: this model directory has no tokenizer; send token ids", "prompt")
        token_ids = encode(tokenizer, item, "prompt")
        if not token_ids:
            raise bad_request("prompt: encodes to no tokens", "prompt")
        return Prompt(item, token_ids)
    bad = [t for t in item if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"prompt: {bad[:5]} are not token ids of this model (0 <= id < {vocab_size})", "prompt")
    # The tokenizer may know fewer ids than the model's (padded) vocabulary: those decode to nothing for echo.
    known = tokenizer is not None and all(t < tokenizer.vocab_size for t in item)
    return Prompt(tokenizer.decode(item, skip_special_tokens=False) if known else "", list(item))


def chat_prompt(tokenizer: Tokenizer | None, request: ChatCompletionRequest) -> Prompt:
    return render_chat(tokenizer, request.messages, request.add_generation_prompt, request.continue_final_message,
                       request.chat_template_kwargs or {})


def render_chat(tokenizer: Tokenizer | None, messages: list[ChatMessage], add_generation_prompt: bool = True,
                continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None) -> Prompt:
    if tokenizer is None:
        raise bad_request("messages: this model directory has no tokenizer (nor chat template)", "messages")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs or {}))
    if reserved:
        raise bad_request(f"chat_template_kwargs: {reserved} are not template variables", "chat_template_kwargs")
    if add_generation_prompt and continue_final_message:
        raise bad_request("continue_final_message: cannot be combined with add_generation_prompt=true",
                          "continue_final_message")
    conversation = [_message(i, m) for i, m in enumerate(messages)]
    try:
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message, **(template_kwargs or {}))
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise bad_request(f"messages: the model's chat template rejected them: {e}", "messages") from e
    return Prompt(text, encode(tokenizer, text, "messages", add_special_tokens=False))


def encode(tokenizer: Tokenizer, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of user text; a 400 for text that is not valid Unicode (JSON allows lone surrogates, "\\ud800",
    which no tokenizer accepts)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"{param}: not valid Unicode ({e.reason} at character {e.start})", param) from e
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _message(index: int, message: ChatMessage) -> dict[str, str]:
    param = f"messages[{index}]"
    if message.tool_calls is not None or message.tool_call_id is not None:
        raise APIError(400, f"{param}: tool calls are not supported", param=f"{param}.tool_calls",
                       code="unsupported_parameter")
    content = message.content
    if isinstance(content, list):
        content = "\n".join(part.text for part in content)
    return {"role": TEMPLATE_ROLES.get(message.role, message.role), "content": content}


def check_context(prompt: Prompt, max_tokens: int | None, is_explicit: bool, max_model_len: int,
                  param: str) -> None:
    """400 when the prompt leaves no room to generate, or when an explicit max_tokens would not fit."""
    num = len(prompt.token_ids)
    if num >= max_model_len:
        raise bad_request(f"{param}: this model's maximum context length is {max_model_len} tokens and the prompt "
                          f"has {num} tokens, leaving no room to generate; shorten it", param,
                          code="context_length_exceeded")
    if is_explicit and max_tokens is not None and num + max_tokens > max_model_len:
        raise bad_request(f"max_tokens: this model's maximum context length is {max_model_len} tokens, but "
                          f"{num + max_tokens} were requested ({num} in the prompt, {max_tokens} for the "
                          f"completion); reduce the prompt or max_tokens", "max_tokens",
                          code="context_length_exceeded")
