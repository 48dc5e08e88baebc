"""What each OpenAI endpoint does, between the parsed request and the response: the server's request lifecycle.

Resolves the model name, builds sampling params and prompts, checks the context, submits one engine request
per prompt through the async bridge, then either streams SSE or waits for the final outputs (a non-streamed
request's engine requests ask for their finished outputs only, so the engine makes no text while they run). A
non-streamed request whose client disconnects is aborted like a streamed one. Maps the bridge's refusals to HTTP errors
(429 with Retry-After, 503) and the engine's (a 400 naming the field, with the code of its `RequestError`). A
request that could never be queued (more sequences, prompts x n, than --max-waiting-requests) is a 400, not a
429 that a client would retry forever.

Nothing that grows with the input runs on the event loop: tokenizing, rendering the chat template and decoding
prompts or token lists longer than `INLINE_SIZE` happen on a worker thread (the tokenizers release the GIL
while they work), so one huge request never stalls the other clients' streams. Smaller ones run inline, where
a thread hop would cost more than the work. Knows nothing of routing or of the engine's internals.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from diffuserve.core.outputs import RequestOutput
from diffuserve.engine.detokenizer import TokenTexts
from diffuserve.sampling_params import RequestOutputKind, SamplingParams
from diffuserve.server.bridge import AsyncEngine, EngineDeadError, EngineRequest, QueueFullError
from diffuserve.server.chat_output import ChatOutputFormat
from diffuserve.server.config import ServerConfig
from diffuserve.server.errors import APIError, bad_request, engine_unavailable, from_value_error, queue_full
from diffuserve.server.metrics import ServerMetrics
from diffuserve.server.output_stream import OutputStream
from diffuserve.server.parsing import chat_params, completion_params
from diffuserve.server.prompt_logprobs import PromptScoring
from diffuserve.server.prompts import (
    Prompt,
    PromptRules,
    chat_prompt,
    check_max_tokens_fit,
    completion_prompts,
    encode,
    messages_size,
    num_prompts,
    prompt_size,
    render_chat,
)
from diffuserve.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from diffuserve.server.reasoning import template_thinks
from diffuserve.server.response_models import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from diffuserve.server.responses import (
    ResponseContext,
    chat_events,
    chat_response,
    completion_events,
    completion_response,
    sse,
)
from diffuserve.text.tokenizer import Tokenizer

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

INLINE_SIZE = 8192
"""Characters (or token ids) up to which prompt work runs inline on the event loop (well under a millisecond)."""

T = TypeVar("T")


@dataclass
class OpenAIServing:
    bridge: AsyncEngine
    tokenizer: Tokenizer | None
    """The server's own instance: the engine's belongs to the engine-loop thread."""
    config: ServerConfig
    model_name: str
    metrics: ServerMetrics
    created: int
    rules: PromptRules
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="diffuserve-tokenize")
    )
    """Where large prompts are tokenized: one thread, so that huge requests queue behind each other rather than
    taking every core from the engine."""
    token_texts: TokenTexts = field(init=False)
    """Token texts for the denoising stream extension, decoded once per token id."""

    def __post_init__(self) -> None:
        self.token_texts = TokenTexts(self.tokenizer)

    @property
    def max_model_len(self) -> int:
        return self.bridge.engine.max_model_len

    async def off_loop(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, on the worker thread when `size` (characters or token ids) is past INLINE_SIZE."""
        if size <= INLINE_SIZE:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def check_admissible(self, num_prompts: int, n: int) -> None:
        """400 for a request larger than the waiting queue could ever hold (a 429 would be retried in vain)."""
        limit = self.config.max_waiting_requests
        if num_prompts * n > limit:
            raise bad_request(
                f"prompt: {num_prompts} prompt(s) x n={n} = {num_prompts * n} sequences, more than this server "
                f"ever queues at once ({limit}, --max-waiting-requests); split the request or raise the flag",
                "n" if num_prompts == 1 else "prompt",
                code="request_too_large",
            )

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter `model` names (None: the base model); 404 naming the served models otherwise."""
        if model is None or model == self.model_name:
            return None
        adapters = self.bridge.engine.adapters.loaded
        if model in adapters:
            return model
        served = ", ".join(repr(name) for name in [self.model_name, *sorted(adapters)])
        raise APIError(
            404, f"model: {model!r} does not exist; this server serves {served}", param="model", code="model_not_found"
        )

    def models(self) -> ModelList:
        """The base model, then every loaded adapter (its `parent` the base)."""
        engine = self.bridge.engine
        card = ModelCard(
            id=self.model_name, created=self.created, root=str(engine.config.model), max_model_len=self.max_model_len
        )
        adapters = [
            card.model_copy(update={"id": name, "root": adapter.path, "parent": self.model_name})
            for name, adapter in sorted(engine.adapters.loaded.items())
        ]
        return ModelList(data=[card, *adapters])

    # ---- generation ----------------------------------------------------------------------------------------
    async def completion(self, body: CompletionRequest, request: Request) -> CompletionResponse | StreamingResponse:
        adapter = self.check_model(body.model)
        params = completion_params(body, self.config.max_n)
        self.check_admissible(num_prompts(body.prompt), params.n)
        prompts = await self.off_loop(
            prompt_size(body.prompt), completion_prompts, self.tokenizer, body.prompt, self.rules
        )
        if "max_tokens" in body.model_fields_set:
            for prompt in prompts:
                check_max_tokens_fit(prompt, params.max_tokens, self.max_model_len)
        scoring = self._prompt_scoring(body, prompts)
        stream, ctx = await self._submit("cmpl", prompts, params, bool(body.stream), scoring=scoring, adapter=adapter)
        if body.stream:
            return _sse_response(sse(stream, completion_events(stream, ctx, body.echo, body.stream_options)))
        return completion_response(ctx, await _collect(stream, request), body.echo)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse | StreamingResponse:
        adapter = self.check_model(body.model)
        template = self.tokenizer.hf.chat_template if self.tokenizer is not None else None
        params = chat_params(body, self.config.max_n, template)
        self.check_admissible(1, params.n)
        prompt = await self.off_loop(messages_size(body.messages), chat_prompt, self.tokenizer, body, self.rules)
        check_max_tokens_fit(prompt, params.max_tokens, self.max_model_len)
        chat_format = ChatOutputFormat(
            template_thinks(template, body.chat_template_kwargs),
            bool(body.tools) and body.tool_choice != "none",
            body.parallel_tool_calls,
        )
        stream, ctx = await self._submit("chatcmpl", [prompt], params, bool(body.stream), chat_format, adapter=adapter)
        if body.stream:
            return _sse_response(sse(stream, chat_events(stream, ctx, body.stream_options)))
        return chat_response(ctx, await _collect(stream, request))

    def _prompt_scoring(self, body: CompletionRequest, prompts: list[Prompt]) -> PromptScoring:
        """Which prompt scores the choices show (the scores come from the engine, with the first token's text)."""
        echo_top = body.logprobs if body.echo else None
        if echo_top is None:
            return PromptScoring(vllm=body.prompt_logprobs is not None)
        tokenizer = self.tokenizer
        first = [p.token_ids[0] for p in prompts]
        texts = [
            tokenizer.decode([t], False) if tokenizer is not None and 0 <= t < tokenizer.vocab_size else f"token_id:{t}"
            for t in first
        ]  # an id outside the vocabulary is refused when submitted
        return PromptScoring(echo_top, body.prompt_logprobs is not None, tuple(texts))

    async def _submit(
        self,
        prefix: str,
        prompts: list[Prompt],
        params: SamplingParams,
        streamed: bool,
        chat_format: ChatOutputFormat | None = None,
        scoring: PromptScoring | None = None,
        adapter: str | None = None,
    ) -> tuple[OutputStream, ResponseContext]:
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        request_ids = [f"{response_id}-{i}" for i in range(len(prompts))]
        engine_params = params if streamed else params.replace(output_kind=RequestOutputKind.FINAL_ONLY)
        requests = [EngineRequest(rid, p.token_ids, engine_params, adapter) for rid, p in zip(request_ids, prompts)]
        try:
            stream = await self.bridge.submit(requests)
        except QueueFullError as e:
            self.metrics.rejected.labels(reason="queue_full").inc()
            raise queue_full(self.config.max_waiting_requests) from e
        except EngineDeadError as e:
            raise engine_unavailable(str(e)) from e
        except ValueError as e:
            raise from_value_error(e, "prompt" if prefix == "cmpl" else "messages") from e
        ctx = ResponseContext(
            response_id,
            int(time.time()),
            adapter or self.model_name,
            prompts,
            request_ids,
            params.n,
            chat_format or ChatOutputFormat(),
            params.logprobs,
            scoring=scoring or PromptScoring(),
            denoising=self.token_texts if params.record_denoising else None,
        )
        return stream, ctx

    # ---- tokenizer endpoints -------------------------------------------------------------------------------
    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("prompt, messages: give exactly one of them", "prompt")
        if body.messages is not None:
            size = messages_size(body.messages)
            prompt = await self.off_loop(
                size, render_chat, self.tokenizer, body.messages, self.rules, body.add_generation_prompt
            )
            token_ids = prompt.token_ids
        elif self.tokenizer is None:
            raise bad_request("prompt: this model directory has no tokenizer", "prompt")
        else:
            token_ids = await self.off_loop(
                len(body.prompt or ""), encode, self.tokenizer, body.prompt or "", "prompt", body.add_special_tokens
            )
        return TokenizeResponse(count=len(token_ids), max_model_len=self.max_model_len, tokens=token_ids)

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(body.model)
        if self.tokenizer is None:
            raise bad_request("tokens: this model directory has no tokenizer", "tokens")
        bad = [t for t in body.tokens if not 0 <= t < self.tokenizer.vocab_size]
        if bad:
            raise bad_request(
                f"tokens: {bad[:5]} are not token ids of this model (0 <= id < {self.tokenizer.vocab_size})", "tokens"
            )
        text = await self.off_loop(len(body.tokens), self.tokenizer.decode, body.tokens, False)
        return DetokenizeResponse(prompt=text)


def _sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)


async def _collect(stream: OutputStream, request: Request) -> dict[str, RequestOutput]:
    """The final output of every engine request; aborts them all if the client disconnects first."""
    collect = asyncio.ensure_future(_finals(stream))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        collect.cancel()
        stream.close()
    if collect in done:
        try:
            return collect.result()
        except EngineDeadError as e:
            raise engine_unavailable(str(e)) from e
    raise APIError(499, "client closed the request", code="client_closed_request")


async def _finals(stream: OutputStream) -> dict[str, RequestOutput]:
    return {output.request_id: output async for output in stream if output.finished}


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
