"""From engine outputs to OpenAI response bodies: choices, usage (with NFE and TPF), and engine failures.

Choice numbering follows OpenAI: with several prompts, prompt p's completion i is choice `p * n + i`.
A completion the engine failed (finish_reason "error", e.g. an exception inside its step) turns the whole
response into a 500 with the engine's message. Knows nothing of HTTP transport or of the engine's internals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diffuserve.engine.outputs import CompletionOutput, RequestOutput
from diffuserve.server.errors import engine_failed
from diffuserve.server.prompts import Prompt
from diffuserve.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
)


@dataclass(frozen=True)
class ResponseContext:
    """What every response of one HTTP request shares."""

    response_id: str
    created: int
    model: str
    prompts: list[Prompt]
    request_ids: list[str]
    """Engine request id per prompt."""
    n: int

    def choice_index(self, request_id: str, completion_index: int) -> int:
        return self.request_ids.index(request_id) * self.n + completion_index


def usage(outputs: Iterable[RequestOutput]) -> Usage:
    outputs = list(outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    num_forwards = sum(o.num_forwards for o in outputs)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens, num_forwards=num_forwards,
        tokens_per_forward=completion_tokens / num_forwards if num_forwards else 0.0,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(o.num_cached_tokens for o in outputs)),
    )


def raise_if_failed(completion: CompletionOutput) -> None:
    if completion.finish_reason == "error":
        raise engine_failed(completion.error or "unknown error")


def _choices(ctx: ResponseContext, outputs: dict[str, RequestOutput]) -> Iterable[tuple[int, int, CompletionOutput]]:
    """(choice index, prompt index, completion) in choice order; raises the first engine failure."""
    for p, request_id in enumerate(ctx.request_ids):
        for completion in outputs[request_id].outputs:
            raise_if_failed(completion)
            yield ctx.choice_index(request_id, completion.index), p, completion


def completion_response(ctx: ResponseContext, outputs: dict[str, RequestOutput], echo: bool) -> CompletionResponse:
    choices = [
        CompletionChoice(index=i, text=(ctx.prompts[p].text if echo else "") + c.text,
                         finish_reason=c.finish_reason, stop_reason=c.stop_reason)
        for i, p, c in _choices(ctx, outputs)
    ]
    return CompletionResponse(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices,
                              usage=usage(outputs.values()))


def chat_response(ctx: ResponseContext, outputs: dict[str, RequestOutput]) -> ChatCompletionResponse:
    choices = [
        ChatChoice(index=i, message=AssistantMessage(content=c.text), finish_reason=c.finish_reason,
                   stop_reason=c.stop_reason)
        for i, _, c in _choices(ctx, outputs)
    ]
    return ChatCompletionResponse(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices,
                                  usage=usage(outputs.values()))
