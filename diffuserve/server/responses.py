"""From engine outputs to OpenAI response bodies: whole responses, and server-sent events for streamed ones.

Choice numbering follows OpenAI: with several prompts, prompt p's completion i is choice `p * n + i`. Usage
counts NFE and TPF as well. A completion the engine failed (finish_reason "error", e.g. an exception inside its
step) turns a whole response into a 500 with the engine's message.

Streaming sends one delta per committed block. The engine's outputs are cumulative and final (only committed
blocks, stop strings applied, a suffix that may still grow into a stop string held back), so a choice's delta is
simply the text past what was already sent, and its logprobs those of the tokens shown since (the engine holds
a token's logprobs back with its text; server/logprobs.py the shapes). Frames are `data: <json>\\n\\n`, ending
with `data: [DONE]\\n\\n`; `stream_options.include_usage` adds a last chunk with `usage` and no choices,
`continuous_usage_stats` puts the usage so far on every chunk. A request that scores its prompt (echo with
logprobs, prompt_logprobs) sends each choice's first chunk (the echoed prompt and its scores, server/
prompt_logprobs.py) once the engine has scored the prompt, which is before its first token; with echo, the
generated tokens' text offsets continue after the prompt's. An engine failure becomes a `data: {"error": {...}}`
frame before `[DONE]`. Closing the stream (client gone) aborts the unfinished requests. With
`stream_options.include_denoising`, chunks of the denoising steps (server/denoising.py) come before each delta.

Knows nothing of routes or of the engine's internals.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field

from pydantic import BaseModel

from diffuserve.core.outputs import CompletionOutput, RequestOutput
from diffuserve.engine.detokenizer import TokenTexts
from diffuserve.server.bridge import EngineDeadError
from diffuserve.server.chat_output import ChatDeltas, ChatOutputFormat
from diffuserve.server.denoising import DenoisingTrace
from diffuserve.server.errors import APIError, engine_failed, engine_unavailable
from diffuserve.server.logprobs import chat_logprobs, completion_logprobs, text_length
from diffuserve.server.output_stream import OutputStream
from diffuserve.server.prompt_logprobs import PromptScoring, concat_logprobs, end_offset
from diffuserve.server.prompts import Prompt
from diffuserve.server.protocol import StreamOptions
from diffuserve.server.response_models import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionDenoisingChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionChunk,
    CompletionDenoisingChunk,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    ErrorResponse,
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
    chat_format: ChatOutputFormat = field(default_factory=ChatOutputFormat)
    """How chat replies split into reasoning, content and tool calls."""
    logprobs: int | None = None
    """Top alternatives per token the request asked for; None: no logprobs."""
    scoring: PromptScoring = field(default_factory=PromptScoring)
    """Which prompt scores completions choices carry."""
    denoising: TokenTexts | None = None
    """With stream_options.include_denoising: how the denoising chunks name tokens; None: no such chunks."""

    def choice_index(self, request_id: str, completion_index: int) -> int:
        return self.request_ids.index(request_id) * self.n + completion_index

    def completion_logprobs(
        self, c: CompletionOutput, start: int = 0, end: int | None = None, echo_offset: int = 0
    ) -> CompletionLogprobs | None:
        """The legacy logprobs of the completion's tokens [start, end) (None unless asked for); `echo_offset`:
        the text offset of the completion's first token (past an echoed prompt)."""
        if self.logprobs is None or c.logprobs is None:
            return None
        offset = echo_offset + text_length(c.logprobs[:start], c.token_ids[:start])
        return completion_logprobs(c.logprobs[start:end], c.token_ids[start:end], self.logprobs, offset)

    def chat_logprobs(self, c: CompletionOutput, start: int = 0, end: int | None = None) -> ChatLogprobs | None:
        """The chat logprobs of the completion's tokens [start, end) (None unless asked for)."""
        if self.logprobs is None or c.logprobs is None:
            return None
        return chat_logprobs(c.logprobs[start:end], c.token_ids[start:end], self.logprobs)


def usage(outputs: Iterable[RequestOutput]) -> Usage:
    outputs = list(outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    num_forwards = sum(o.num_forwards for o in outputs)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        num_forwards=num_forwards,
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
        CompletionChoice(
            index=i,
            text=(ctx.prompts[p].text if echo else "") + c.text,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            logprobs=_choice_logprobs(ctx, p, outputs[ctx.request_ids[p]], c),
            prompt_logprobs=ctx.scoring.prompt_logprobs(outputs[ctx.request_ids[p]]),
        )
        for i, p, c in _choices(ctx, outputs)
    ]
    return CompletionResponse(
        id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage(outputs.values())
    )


def _choice_logprobs(
    ctx: ResponseContext, prompt: int, output: RequestOutput, c: CompletionOutput
) -> CompletionLogprobs | None:
    """A whole choice's legacy logprobs: its echoed prompt's (when asked), then its generated tokens'."""
    echoed = ctx.scoring.echo_logprobs(prompt, output)
    return concat_logprobs(echoed, ctx.completion_logprobs(c, echo_offset=end_offset(echoed)))


def chat_response(ctx: ResponseContext, outputs: dict[str, RequestOutput]) -> ChatCompletionResponse:
    choices = [
        ChatChoice(
            index=i,
            message=ctx.chat_format.message(c.text),
            finish_reason=ctx.chat_format.finish_reason(c.text, c.finish_reason),
            stop_reason=c.stop_reason,
            logprobs=ctx.chat_logprobs(c),
        )
        for i, _, c in _choices(ctx, outputs)
    ]
    return ChatCompletionResponse(
        id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage(outputs.values())
    )


@dataclass
class _Deltas:
    """Turns cumulative outputs into per-choice deltas."""

    ctx: ResponseContext
    sent: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    latest: dict[str, RequestOutput] = field(default_factory=dict)
    logprobs_sent: dict[int, int] = field(default_factory=dict)
    """Per choice, the tokens whose logprobs were sent."""

    def of(self, output: RequestOutput) -> list[tuple[int, str, CompletionOutput]]:
        """(choice index, new text, completion) for every choice with new text or logprobs, or that just
        finished."""
        self.latest[output.request_id] = output
        deltas = []
        for completion in output.outputs:
            index = self.ctx.choice_index(output.request_id, completion.index)
            if index in self.done:
                continue
            raise_if_failed(completion)
            text = completion.text[self.sent.get(index, 0) :]
            if text or completion.finished or self.logprobs_sent.get(index, 0) < len(completion.logprobs or ()):
                deltas.append((index, text, completion))
            self.sent[index] = len(completion.text)
            if completion.finished:
                self.done.add(index)
        return deltas

    def take_logprobs(self, index: int, completion: CompletionOutput) -> tuple[int, int]:
        """The range of the choice's tokens whose logprobs go in the chunk being sent (then marked sent)."""
        start = self.logprobs_sent.get(index, 0)
        self.logprobs_sent[index] = end = len(completion.logprobs or ())
        return start, end

    def usage(self, options: StreamOptions | None, final: bool = False) -> Usage | None:
        wanted = options is not None and (options.continuous_usage_stats or (final and options.include_usage))
        return usage(self.latest.values()) if wanted else None


async def sse(stream: OutputStream, events: AsyncGenerator[BaseModel, None]) -> AsyncIterator[str]:
    """Frames `events` as SSE; closes (aborts) the stream however it ends."""
    try:
        async with aclosing(events):
            async for event in events:
                yield f"data: {event.model_dump_json()}\n\n"
    except APIError as e:
        yield f"data: {ErrorResponse(error=e.info).model_dump_json()}\n\n"
    except EngineDeadError as e:
        yield f"data: {ErrorResponse(error=engine_unavailable(str(e)).info).model_dump_json()}\n\n"
    finally:
        stream.close()
    yield "data: [DONE]\n\n"


async def completion_events(
    stream: OutputStream, ctx: ResponseContext, echo: bool, options: StreamOptions | None
) -> AsyncGenerator[CompletionChunk, None]:
    deltas = _Deltas(ctx)

    def chunk(choices: list[CompletionChoice], final: bool = False) -> CompletionChunk:
        return CompletionChunk(
            id=ctx.response_id,
            created=ctx.created,
            model=ctx.model,
            choices=choices,
            usage=deltas.usage(options, final),
        )

    unscored = {ctx.request_ids[p] for p in range(len(ctx.prompts))} if ctx.scoring.asks else set()
    echo_offsets: dict[str, int] = {}  # per request: where its generated tokens' text offsets start
    if echo and not unscored:
        for index in range(len(ctx.prompts) * ctx.n):
            yield chunk([CompletionChoice(index=index, text=ctx.prompts[index // ctx.n].text)])
    trace = _denoising_trace(ctx)
    async for output in stream:
        if trace is not None and (steps := trace.take(output)):
            yield CompletionDenoisingChunk(**trace.chunk_fields, denoising=steps)
        if output.request_id in unscored and output.prompt_logprobs is not None:
            unscored.discard(output.request_id)
            choices = _scored_prompt_choices(ctx, output, echo)
            echo_offsets[output.request_id] = end_offset(choices[0].logprobs)
            yield chunk(choices)
        for index, text, c in deltas.of(output):
            start, end = deltas.take_logprobs(index, c)
            logprobs = ctx.completion_logprobs(c, start, end, echo_offsets.get(output.request_id, 0))
            choice = CompletionChoice(
                index=index, text=text, finish_reason=c.finish_reason, stop_reason=c.stop_reason, logprobs=logprobs
            )
            yield chunk([choice])
    if options is not None and options.include_usage:
        yield chunk([], final=True)


def _scored_prompt_choices(ctx: ResponseContext, output: RequestOutput, echo: bool) -> list[CompletionChoice]:
    """The first chunk's choices of a prompt the engine has scored: its echo (if asked) and its scores."""
    p = ctx.request_ids.index(output.request_id)
    echoed, scores = ctx.scoring.echo_logprobs(p, output), ctx.scoring.prompt_logprobs(output)
    return [
        CompletionChoice(
            index=ctx.choice_index(output.request_id, i),
            text=ctx.prompts[p].text if echo else "",
            logprobs=echoed,
            prompt_logprobs=scores,
        )
        for i in range(ctx.n)
    ]


async def chat_events(
    stream: OutputStream, ctx: ResponseContext, options: StreamOptions | None
) -> AsyncGenerator[ChatCompletionChunk, None]:
    deltas = _Deltas(ctx)

    def chunk(choices: list[ChatChunkChoice], final: bool = False) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=ctx.response_id,
            created=ctx.created,
            model=ctx.model,
            choices=choices,
            usage=deltas.usage(options, final),
        )

    # OpenAI's first chunk of each choice announces the role.
    for index in range(len(ctx.prompts) * ctx.n):
        yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
    states: dict[int, ChatDeltas] = {}
    trace = _denoising_trace(ctx)
    async for output in stream:
        if trace is not None and (steps := trace.take(output)):
            yield ChatCompletionDenoisingChunk(**trace.chunk_fields, denoising=steps)
        for index, _, c in deltas.of(output):
            delta = states.setdefault(index, ChatDeltas(ctx.chat_format)).delta(c.text, c.finished)
            if delta is None and not c.finished:
                continue
            yield chunk(
                [
                    ChatChunkChoice(
                        index=index,
                        delta=delta or DeltaMessage(),
                        finish_reason=ctx.chat_format.finish_reason(c.text, c.finish_reason),
                        stop_reason=c.stop_reason,
                        logprobs=ctx.chat_logprobs(c, *deltas.take_logprobs(index, c)),
                    )
                ]
            )
    if options is not None and options.include_usage:
        yield chunk([], final=True)


def _denoising_trace(ctx: ResponseContext) -> DenoisingTrace | None:
    """The trace of a response that asked for denoising chunks; None for one that did not."""
    if ctx.denoising is None:
        return None
    fields = {"id": ctx.response_id, "created": ctx.created, "model": ctx.model, "choices": []}
    return DenoisingTrace(ctx.denoising, ctx.choice_index, fields)
