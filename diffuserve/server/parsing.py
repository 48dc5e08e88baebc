"""From an OpenAI request to what the engine takes: `SamplingParams`, and prompts as token ids.

Sampling params, and the policy for fields diffuserve lacks:
- Fields OpenAI or vLLM define but diffuserve does not implement (logprobs, penalties, ...) are rejected with
  a 400 naming the field unless they carry their neutral value: never silently ignored.
- Structured output and tool choice become the request's grammar (server/structured.py, server/tool_calls.py).
- Unknown fields are ignored with a logged warning, as vLLM does: clients and harnesses send vendor extras, and
  failing on them would break them for no benefit.
- Temperatures so small that the tempered logits would overflow are raised to 0.01, as vLLM does.

Prompts: completions take text, token ids, or a list of either (one engine request per prompt); chat messages
are rendered with the model's own chat template (text content only) and encoded without adding special tokens
again. A prompt that leaves no room within max_model_len, or an explicit max_tokens that does not fit, is a 400
with both numbers (OpenAI's `context_length_exceeded`: the engine only clamps max_tokens to the room left).
Stop token ids are range-checked by the engine (`LLMEngine.add_request`), not here. Uses the server's own
tokenizer instance, never the engine's (which lives on the engine-loop thread).

Knows nothing of the engine's internals or of HTTP transport.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import jinja2

from diffuserve.sampling_params import SamplingParams
from diffuserve.server.errors import APIError, bad_request, from_value_error
from diffuserve.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields, Tool
from diffuserve.server.reasoning import template_thinks
from diffuserve.server.structured import structured_outputs
from diffuserve.server.tool_calls import check_messages, tool_call_grammar
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.tokenizer import Tokenizer
from diffuserve.tool_format import template_messages, template_renders_tools

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-2
"""Positive temperatures below this are raised to it (1/T overflows the logits' fp32 range far below 1e-2)."""

NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "use_beam_search": (False,),
    "bad_words": ([],),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "functions": ([],),
    "modalities": (["text"],),
    "echo": (False,),
    "suffix": ("",),
}
"""Values of unsupported fields that ask for nothing (None is neutral for all of them)."""

UNSUPPORTED_COMMON = (
    "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "use_beam_search",
    "allowed_token_ids", "bad_words", "prompt_logprobs", "truncate_prompt_tokens",
)
UNSUPPORTED_COMPLETION = ("logprobs", "suffix")
UNSUPPORTED_CHAT = (
    "logprobs", "top_logprobs", "functions", "function_call", "audio", "modalities",
    "prediction", "reasoning_effort", "web_search_options", "chat_template", "documents", "echo",
)


def completion_params(request: CompletionRequest, max_n: int) -> SamplingParams:
    _reject_unsupported(request, UNSUPPORTED_COMMON + UNSUPPORTED_COMPLETION)
    if request.best_of is not None and request.best_of != request.n:
        raise APIError(400, f"best_of: only best_of == n is supported (got best_of={request.best_of!r}, "
                       f"n={request.n})", param="best_of", code="unsupported_parameter")
    return _sampling_params(request, request.max_tokens, max_n, structured_outputs(request))


def chat_params(request: ChatCompletionRequest, max_n: int, chat_template: Any = None) -> SamplingParams:
    """`chat_template`: the model's, to tell whether it thinks (the grammar then starts after `</think>`)."""
    _reject_unsupported(request, UNSUPPORTED_COMMON + UNSUPPORTED_CHAT)
    tool_grammar = tool_call_grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
    structured = structured_outputs(request, tool_grammar, template_thinks(chat_template, request.chat_template_kwargs))
    return _sampling_params(request, chat_max_tokens(request), max_n, structured)


def chat_max_tokens(request: ChatCompletionRequest) -> int | None:
    """max_completion_tokens wins over the deprecated max_tokens (as OpenAI and vLLM)."""
    return request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens


def _sampling_params(request: SamplingFields, max_tokens: int | None, max_n: int,
                     structured: StructuredOutputsParams | None = None) -> SamplingParams:
    _warn_unknown(request)
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options: only allowed when stream is true", "stream_options")
    if request.n > max_n:
        raise bad_request(f"n: got {request.n}, this server allows at most {max_n} (--max-n)", "n")
    temperature = request.temperature
    if temperature is not None and 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    try:
        return SamplingParams(
            n=request.n, temperature=temperature, top_p=request.top_p, top_k=request.top_k, seed=request.seed,
            max_tokens=max_tokens, min_tokens=request.min_tokens, stop=_stops(request.stop),
            stop_token_ids=list(request.stop_token_ids or []), ignore_eos=request.ignore_eos,
            skip_special_tokens=request.skip_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output, decoder=request.decoder,
            threshold=request.threshold, steps=request.steps, entropy_bound=request.entropy_bound,
            edit_threshold=request.edit_threshold, max_post_edit_steps=request.max_post_edit_steps,
            structured_outputs=structured,
        )
    except ValueError as e:
        raise from_value_error(e) from e


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _reject_unsupported(request: SamplingFields, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(request, name)
        if value is None or any(type(value) is type(n) and value == n for n in NEUTRAL.get(name, ())):
            continue
        raise APIError(400, f"{name}: not supported by diffuserve (got {value!r:.80}); remove the field",
                       param=name, code="unsupported_parameter")


def _warn_unknown(request: SamplingFields) -> None:
    if request.model_extra:
        logger.warning("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))


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
                       request.chat_template_kwargs or {}, request.tools)


def render_chat(tokenizer: Tokenizer | None, messages: list[ChatMessage], add_generation_prompt: bool = True,
                continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                tools: list[Tool] | None = None) -> Prompt:
    if tokenizer is None:
        raise bad_request("messages: this model directory has no tokenizer (nor chat template)", "messages")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs or {}))
    if reserved:
        raise bad_request(f"chat_template_kwargs: {reserved} are not template variables", "chat_template_kwargs")
    if add_generation_prompt and continue_final_message:
        raise bad_request("continue_final_message: cannot be combined with add_generation_prompt=true",
                          "continue_final_message")
    check_messages(messages)
    renders_tools = template_renders_tools(tokenizer.hf.chat_template)
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    conversation = template_messages([_message(m) for m in messages], tool_dicts, renders_tools)
    if tool_dicts and renders_tools:
        template_kwargs = {**(template_kwargs or {}), "tools": tool_dicts}
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


def _message(message: ChatMessage) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        content = "\n".join(part.text for part in content)
    out: dict[str, Any] = {"role": TEMPLATE_ROLES.get(message.role, message.role), "content": content}
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


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
