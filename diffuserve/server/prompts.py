"""From an OpenAI request's prompt or messages to the token ids the engine takes, with the checks on them.

Completions take text, token ids, or a list of either (one engine request per prompt); chat messages go through
the chat renderer the offline API uses too (`diffuserve/text/chat_template.py`: the model's own chat template, text
content only, no special tokens added again), so the same messages are the same tokens offline and here.
A prompt that leaves no room within max_model_len, or an explicit max_tokens that does not fit, is a 400 with
both numbers (OpenAI's `context_length_exceeded`: the engine only clamps max_tokens to the room left). A text so
long that it cannot fit whatever it encodes to is refused from its length alone, before tokenizing
(`Tokenizer.min_num_tokens`).

Special tokens: the mask token is never part of a prompt. A completion prompt (text or ids) may hold the special
tokens the chat template emits, BOS and EOS, and no other special token. In chat messages, text that spells a
special token is plain text (as transformers' `split_special_tokens`); only the template's own markers are
special.

Everything here is synchronous and may take time proportional to the input: the server runs it off the event
loop for large inputs. Uses the server's own tokenizer instance, never the engine's (which lives on the
engine-loop thread). Knows nothing of HTTP transport or of the engine's internals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from diffuserve.errors import RequestError
from diffuserve.server.errors import bad_request, from_value_error
from diffuserve.server.protocol import ChatCompletionRequest, ChatMessage, Tool
from diffuserve.server.tool_calls import check_messages
from diffuserve.text.chat_template import render_conversation
from diffuserve.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class Prompt:
    text: str
    """What `echo` returns (the prompt text, or its token ids decoded)."""
    token_ids: list[int]


@dataclass(frozen=True)
class PromptRules:
    """What a prompt must respect, besides fitting the context (checked with the request's max_tokens)."""

    max_model_len: int
    vocab_size: int
    mask_token_id: int
    forbidden_ids: frozenset[int]
    """Special ids a completion prompt may not hold: every special id but the template's own, BOS and EOS, and
    always the mask token."""

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer | None,
        max_model_len: int,
        vocab_size: int,
        mask_token_id: int,
        eos_token_ids: Iterable[int],
    ) -> PromptRules:
        allowed: set[int] = set(eos_token_ids)
        special: set[int] = set()
        if tokenizer is not None:
            named = {t for t in (tokenizer.bos_token_id, tokenizer.eos_token_id) if t is not None}
            allowed |= tokenizer.template_special_ids | named
            special = set(tokenizer.special_ids)
        forbidden = (special - allowed) | {mask_token_id}
        return cls(max_model_len, vocab_size, mask_token_id, frozenset(forbidden))


def num_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    return 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)


def prompt_size(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    """Characters plus token ids: what tokenizing or decoding the prompt costs."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(1 if isinstance(item, int) else len(item) for item in prompt)


def messages_size(messages: list[ChatMessage]) -> int:
    """Characters of message text (an assistant message that only carries tool calls has no content)."""
    return sum(
        len(m.content) if isinstance(m.content, str) else sum(len(p.text) for p in m.content or ()) for m in messages
    )


def completion_prompts(
    tokenizer: Tokenizer | None, prompt: str | list[str] | list[int] | list[list[int]], rules: PromptRules
) -> list[Prompt]:
    # One prompt (text or token ids) or a list of them: mypy cannot narrow a list by its first item's type.
    is_single = isinstance(prompt, str) or isinstance(prompt[0], int)
    items = [cast("str | list[int]", prompt)] if is_single else cast("list[str] | list[list[int]]", prompt)
    return [_one_prompt(tokenizer, item, rules) for item in items]


def _one_prompt(tokenizer: Tokenizer | None, item: str | list[int], rules: PromptRules) -> Prompt:
    if isinstance(item, str):
        if tokenizer is None:
            raise bad_request("prompt: this model directory has no tokenizer; send token ids", "prompt")
        check_length(tokenizer, item, rules.max_model_len, "prompt")
        token_ids = encode(tokenizer, item, "prompt")
        if not token_ids:
            raise bad_request("prompt: encodes to no tokens", "prompt")
        check_special_ids(tokenizer, token_ids, rules.forbidden_ids, rules.mask_token_id, "prompt")
        return Prompt(item, token_ids)
    # Ids outside the vocabulary are the engine's to refuse (InvalidTokenIds, when the request is submitted).
    check_special_ids(tokenizer, item, rules.forbidden_ids, rules.mask_token_id, "prompt")
    # The tokenizer may know fewer ids than the model's (padded) vocabulary: those decode to nothing for echo.
    text = ""
    if tokenizer is not None and all(0 <= t < tokenizer.vocab_size for t in item):
        text = tokenizer.decode(item, skip_special_tokens=False)
    return Prompt(text, list(item))


def check_special_ids(
    tokenizer: Tokenizer | None, token_ids: list[int], forbidden: frozenset[int], mask_token_id: int, param: str
) -> None:
    """400 naming the first forbidden special token in `token_ids`."""
    found = next((t for t in token_ids if t in forbidden), None)
    if found is None:
        return
    name = ""
    if tokenizer is not None and found < tokenizer.vocab_size:
        name = f" ({tokenizer.decode([found], skip_special_tokens=False)!r})"
    if found == mask_token_id:
        why = "is the model's mask token, which no prompt may contain"
    else:
        why = (
            "is a special token this model's chat template never emits; a prompt may contain only the "
            "template's special tokens, BOS and EOS"
        )
    raise bad_request(f"{param}: token id {found}{name} {why}; remove it", param)


def check_length(tokenizer: Tokenizer, text: str, max_model_len: int, param: str) -> None:
    """400 for a text too long to fit whatever it encodes to (from its length alone: no tokenizing)."""
    at_least = tokenizer.min_num_tokens(len(text))
    if at_least >= max_model_len:
        raise bad_request(
            f"{param}: this model's maximum context length is {max_model_len} tokens and the prompt "
            f"has {len(text)} characters, so at least {at_least} tokens; shorten it",
            param,
            code="context_length_exceeded",
        )


def chat_prompt(tokenizer: Tokenizer | None, request: ChatCompletionRequest, rules: PromptRules) -> Prompt:
    return render_chat(
        tokenizer,
        request.messages,
        rules,
        request.add_generation_prompt,
        request.continue_final_message,
        request.chat_template_kwargs or {},
        request.tools,
    )


def render_chat(
    tokenizer: Tokenizer | None,
    messages: list[ChatMessage],
    rules: PromptRules,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[Tool] | None = None,
) -> Prompt:
    """The request's messages through the shared chat renderer (`diffuserve/text/chat_template.py`, as `LLM.chat`), with
    the server's checks: tool messages, the length bound before tokenizing, no mask token."""
    if tokenizer is None:
        raise bad_request("messages: this model directory has no tokenizer (nor chat template)", "messages")
    check_messages(messages)
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    try:
        chat = render_conversation(
            tokenizer,
            [_message(m) for m in messages],
            tool_dicts,
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
        )
        check_length(tokenizer, chat.text, rules.max_model_len, "messages")
        token_ids = chat.token_ids()
    except RequestError as e:
        raise from_value_error(e, "messages") from e
    check_special_ids(tokenizer, token_ids, frozenset({rules.mask_token_id}), rules.mask_token_id, "messages")
    return Prompt(chat.text, token_ids)


def encode(tokenizer: Tokenizer, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of user text; a 400 for text that is not valid Unicode (JSON allows lone surrogates, "\\ud800",
    which no tokenizer accepts)."""
    _check_unicode(text, param)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _check_unicode(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"{param}: not valid Unicode ({e.reason} at character {e.start})", param) from e


def _message(message: ChatMessage) -> dict[str, Any]:
    """A wire message as the OpenAI dict the chat renderer takes (only the fields the template sees)."""
    content = message.content
    parts = [part.model_dump() for part in content] if isinstance(content, list) else content
    out: dict[str, Any] = {"role": message.role, "content": parts}
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def check_max_tokens_fit(prompt: Prompt, max_tokens: int | None, max_model_len: int) -> None:
    """400 when a max_tokens the client sent cannot fit after the prompt. The HTTP API's rule, as OpenAI's and
    vLLM's: the engine itself caps max_tokens to the room left (the offline API's default of 16 must not fail a
    long prompt), and refuses a prompt that leaves no room at all."""
    num = len(prompt.token_ids)
    if max_tokens is not None and num + max_tokens > max_model_len:
        raise bad_request(
            f"max_tokens: this model's maximum context length is {max_model_len} tokens, but "
            f"{num + max_tokens} were requested ({num} in the prompt, {max_tokens} for the "
            f"completion); reduce the prompt or max_tokens",
            "max_tokens",
            code="context_length_exceeded",
        )
