"""From an OpenAI request to what the engine takes: `SamplingParams` (prompts are `prompts`' business).

Sampling params, and the policy for fields diffuserve lacks:
- Fields OpenAI or vLLM define but diffuserve does not implement (logit_bias, min_p, ...) are rejected with a 400
  naming the field unless they carry their neutral value: never silently ignored.
- Logprobs: chat's `logprobs` + `top_logprobs` and completions' `logprobs` become `SamplingParams.logprobs`.
- Prompt scoring: completions' `prompt_logprobs`, and `logprobs` with `echo` (the echoed prompt's logprobs,
  lm-eval's loglikelihood request), become `SamplingParams.prompt_logprobs`.
- Structured output and tool choice become the request's grammar (server/structured.py, server/tool_calls.py).
- Unknown fields are ignored with a logged warning, as vLLM does: clients and harnesses send vendor extras, and
  failing on them would break them for no benefit.
- Temperatures so small that the tempered logits would overflow are raised to 0.01, as vLLM does.

Knows nothing of the engine's internals or of HTTP transport.
"""

from __future__ import annotations

import logging
from typing import Any

from diffuserve.sampling_params import SamplingParams
from diffuserve.server.errors import APIError, bad_request, from_value_error
from diffuserve.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from diffuserve.server.reasoning import template_thinks
from diffuserve.server.structured import structured_outputs
from diffuserve.server.tool_calls import tool_call_grammar
from diffuserve.structured_outputs import StructuredOutputsParams

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-2
"""Positive temperatures below this are raised to it (1/T overflows the logits' fp32 range far below 1e-2)."""

NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logit_bias": ({},),
    "min_p": (0, 0.0),
    "use_beam_search": (False,),
    "bad_words": ([],),
    "functions": ([],),
    "modalities": (["text"],),
    "echo": (False,),
    "suffix": ("",),
}
"""Values of unsupported fields that ask for nothing (None is neutral for all of them)."""

UNSUPPORTED_COMMON = (
    "logit_bias",
    "min_p",
    "use_beam_search",
    "allowed_token_ids",
    "bad_words",
    "truncate_prompt_tokens",
)
UNSUPPORTED_COMPLETION = ("suffix",)
UNSUPPORTED_CHAT = (
    "prompt_logprobs",
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "chat_template",
    "documents",
    "echo",
)


def completion_params(request: CompletionRequest, max_n: int) -> SamplingParams:
    _reject_unsupported(request, UNSUPPORTED_COMMON + UNSUPPORTED_COMPLETION)
    if request.best_of is not None and request.best_of != request.n:
        raise APIError(
            400,
            f"best_of: only best_of == n is supported (got best_of={request.best_of!r}, n={request.n})",
            param="best_of",
            code="unsupported_parameter",
        )
    params = _sampling_params(request, request.max_tokens, max_n, structured_outputs(request), request.logprobs)
    return params.replace(prompt_logprobs=completion_prompt_logprobs(request))


def completion_prompt_logprobs(request: CompletionRequest) -> int | None:
    """Top alternatives to compute per prompt token: `prompt_logprobs`, or `logprobs` when `echo` returns the
    prompt (the larger when both are set); None when the prompt is not scored."""
    wanted = [k for k in (request.prompt_logprobs, request.logprobs if request.echo else None) if k is not None]
    return max(wanted) if wanted else None


def chat_params(request: ChatCompletionRequest, max_n: int, chat_template: Any = None) -> SamplingParams:
    """`chat_template`: the model's, to tell whether it thinks (the grammar then starts after `</think>`)."""
    _reject_unsupported(request, UNSUPPORTED_COMMON + UNSUPPORTED_CHAT)
    tool_grammar = tool_call_grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
    structured = structured_outputs(request, tool_grammar, template_thinks(chat_template, request.chat_template_kwargs))
    return _sampling_params(request, chat_max_tokens(request), max_n, structured, chat_logprobs(request))


def chat_logprobs(request: ChatCompletionRequest) -> int | None:
    """The top alternatives per token chat asks for (`top_logprobs`, which needs `logprobs: true`); None for no
    logprobs."""
    if request.top_logprobs and not request.logprobs:
        raise bad_request(
            f"top_logprobs: got {request.top_logprobs}, which needs logprobs: true; set logprobs", "top_logprobs"
        )
    return (request.top_logprobs or 0) if request.logprobs else None


def chat_max_tokens(request: ChatCompletionRequest) -> int | None:
    """max_completion_tokens wins over the deprecated max_tokens (as OpenAI and vLLM)."""
    return request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens


def _sampling_params(
    request: SamplingFields,
    max_tokens: int | None,
    max_n: int,
    structured: StructuredOutputsParams | None = None,
    logprobs: int | None = None,
) -> SamplingParams:
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
            n=request.n,
            temperature=temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            stop=_stops(request.stop),
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            skip_special_tokens=request.skip_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output,
            decoder=request.decoder,
            threshold=request.threshold,
            steps=request.steps,
            entropy_bound=request.entropy_bound,
            edit_threshold=request.edit_threshold,
            max_post_edit_steps=request.max_post_edit_steps,
            t_min=request.t_min,
            t_max=request.t_max,
            stability_threshold=request.stability_threshold,
            confidence_threshold=request.confidence_threshold,
            structured_outputs=structured,
            logprobs=logprobs,
            record_denoising=request.stream_options is not None and request.stream_options.include_denoising,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            penalize_prompt=request.penalize_prompt,
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
        raise APIError(
            400,
            f"{name}: not supported by diffuserve (got {value!r:.80}); remove the field",
            param=name,
            code="unsupported_parameter",
        )


def _warn_unknown(request: SamplingFields) -> None:
    if request.model_extra:
        logger.warning("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))
