"""Server-sent events for streamed completions and chat completions: one delta per committed block.

The engine's outputs are cumulative and final (only committed blocks, stop strings applied, a suffix that may
still grow into a stop string held back), so a choice's delta is simply the text past what was already sent.
Frames are `data: <json>\\n\\n`, ending with `data: [DONE]\\n\\n`; `stream_options.include_usage` adds a last
chunk with `usage` and no choices, `continuous_usage_stats` puts the usage so far on every chunk. An engine
failure becomes a `data: {"error": {...}}` frame before `[DONE]`. Closing the stream (client gone) aborts the
unfinished requests. Knows nothing of routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from pydantic import BaseModel

from diffuserve.engine.outputs import CompletionOutput, RequestOutput
from diffuserve.server.async_engine import EngineDeadError
from diffuserve.server.errors import APIError, engine_unavailable
from diffuserve.server.output_stream import OutputStream
from diffuserve.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionChunk,
    DeltaMessage,
    ErrorResponse,
    StreamOptions,
    Usage,
)
from diffuserve.server.responses import ResponseContext, raise_if_failed, usage


@dataclass
class _Deltas:
    """Turns cumulative outputs into per-choice deltas."""

    ctx: ResponseContext
    sent: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    latest: dict[str, RequestOutput] = field(default_factory=dict)

    def of(self, output: RequestOutput) -> list[tuple[int, str, CompletionOutput]]:
        """(choice index, new text, completion) for every choice with new text or that just finished."""
        self.latest[output.request_id] = output
        deltas = []
        for completion in output.outputs:
            index = self.ctx.choice_index(output.request_id, completion.index)
            if index in self.done:
                continue
            raise_if_failed(completion)
            text = completion.text[self.sent.get(index, 0):]
            if text or completion.finished:
                deltas.append((index, text, completion))
            self.sent[index] = len(completion.text)
            if completion.finished:
                self.done.add(index)
        return deltas

    def usage(self, options: StreamOptions | None, final: bool = False) -> Usage | None:
        wanted = options is not None and (options.continuous_usage_stats or (final and options.include_usage))
        return usage(self.latest.values()) if wanted else None


async def sse(stream: OutputStream, events: AsyncIterator[BaseModel]) -> AsyncIterator[str]:
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


async def completion_events(stream: OutputStream, ctx: ResponseContext, echo: bool,
                            options: StreamOptions | None) -> AsyncIterator[CompletionChunk]:
    deltas = _Deltas(ctx)

    def chunk(choices: list[CompletionChoice], final: bool = False) -> CompletionChunk:
        return CompletionChunk(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices,
                               usage=deltas.usage(options, final))

    if echo:
        for index in range(len(ctx.prompts) * ctx.n):
            yield chunk([CompletionChoice(index=index, text=ctx.prompts[index // ctx.n].text)])
    async for output in stream:
        for index, text, c in deltas.of(output):
            yield chunk([CompletionChoice(index=index, text=text, finish_reason=c.finish_reason,
                                          stop_reason=c.stop_reason)])
    if options is not None and options.include_usage:
        yield chunk([], final=True)


async def chat_events(stream: OutputStream, ctx: ResponseContext,
                      options: StreamOptions | None) -> AsyncIterator[ChatCompletionChunk]:
    deltas = _Deltas(ctx)

    def chunk(choices: list[ChatChunkChoice], final: bool = False) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices,
                                   usage=deltas.usage(options, final))

    # OpenAI's first chunk of each choice announces the role.
    for index in range(len(ctx.prompts) * ctx.n):
        yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
    async for output in stream:
        for index, text, c in deltas.of(output):
            yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(content=text or None),
                                         finish_reason=c.finish_reason, stop_reason=c.stop_reason)])
    if options is not None and options.include_usage:
        yield chunk([], final=True)
