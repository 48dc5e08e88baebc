"""The FastAPI application: routes, and the wiring of engine, bridge, metrics and the request guard.

Routes only translate HTTP to `OpenAIServing` calls. The engine-loop thread starts and stops with the app
(lifespan). The API key and the body size limit are checked by `guards.RequestGuard` before any body is read;
the protected routes also declare the bearer scheme as a dependency, only so that /openapi.json documents it.
The web console (console.py) is mounted unless --no-web-console; the planner routes (plan_api.py) always are.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST

from diffuserve import __version__
from diffuserve.sampling_defaults import DECODERS
from diffuserve.sampling_params import SamplingParams
from diffuserve.server.adapter_routes import adapter_routes
from diffuserve.server.bridge import AsyncEngine
from diffuserve.server.config import ServerConfig
from diffuserve.server.console.page import Console, console_api_routes, console_routes, load_assets
from diffuserve.server.console.plan_api import Planner
from diffuserve.server.console.plan_models import PlanPresets, PlanRequest, PlanResponse
from diffuserve.server.errors import engine_unavailable, install_error_handlers
from diffuserve.server.guards import Credentials, RequestGuard, default_max_request_bytes
from diffuserve.server.metrics import ServerMetrics
from diffuserve.server.prompts import PromptRules
from diffuserve.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from diffuserve.server.response_models import (
    ChatCompletionResponse,
    CompletionResponse,
    ConsoleConfig,
    DecodingDefaults,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    VersionResponse,
)
from diffuserve.server.serving import OpenAIServing
from diffuserve.server.worker_info import worker_info_routes
from diffuserve.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from diffuserve.engine.llm_engine import LLMEngine

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 409, 413, 429, 500, 503)
}
STREAM: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "JSON body, or SSE frames when stream=true"}
}

_bearer = HTTPBearer(auto_error=False, description="The server's --api-key (or DIFFUSERVE_API_KEY).")


def build_app(engine: LLMEngine, config: ServerConfig) -> FastAPI:
    """The server for `engine`; its state is `app.state.serving` (an OpenAIServing)."""
    model_name = config.served_model_name or str(engine.config.model)
    metrics = ServerMetrics(model_name, vllm_names=config.metrics_vllm_names, num_kv_pages=engine.pool.num_pages)
    bridge = AsyncEngine(engine, config.max_waiting_requests, metrics)
    tokenizer = Tokenizer(engine.config.model) if engine.tokenizer is not None else None
    rules = PromptRules.build(
        tokenizer, engine.max_model_len, engine.args.vocab_size, engine.args.mask_token_id, engine.args.eos_token_ids
    )
    serving = OpenAIServing(bridge, tokenizer, config, model_name, metrics, int(time.time()), rules)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        bridge.start()
        try:
            yield
        finally:
            serving.close()
            bridge.shutdown()

    app = FastAPI(
        title="diffuserve",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible server for block-diffusion MoE language models.",
    )
    app.state.serving = serving
    install_error_handlers(app)
    credentials = Credentials(config.api_key)
    app.add_middleware(
        RequestGuard,
        credentials=credentials,
        max_request_bytes=config.max_request_bytes or default_max_request_bytes(engine.max_model_len),
    )
    app.include_router(_public_routes(serving))
    protected = [
        _api_routes(serving),
        adapter_routes(bridge),
        worker_info_routes(engine, config, model_name, metrics),
        _plan_routes(Planner(model_name, str(engine.config.model))),
    ]
    if not config.no_web_console:
        console = Console(credentials, _console_config(engine, model_name, config), load_assets())
        app.include_router(console_routes(console))
        protected.append(console_api_routes(console))
    for router in protected:
        app.include_router(router, dependencies=[Depends(_bearer)], responses=ERRORS)
    return app


def _console_config(engine: LLMEngine, model_name: str, config: ServerConfig) -> ConsoleConfig:
    defaults = SamplingParams(max_tokens=1).with_defaults(engine.generation_defaults)
    return ConsoleConfig(
        model=model_name,
        max_model_len=engine.max_model_len,
        block_length=engine.args.block_length,
        decoders=list(DECODERS),
        defaults=DecodingDefaults(
            temperature=defaults.temperature, decoder=defaults.decoder, threshold=defaults.threshold
        ),
        api_key_required=config.api_key is not None,
    )


def _plan_routes(planner: Planner) -> APIRouter:
    router = APIRouter()

    @router.get("/plan/presets")
    async def presets() -> PlanPresets:
        return planner.presets()

    @router.post("/plan")
    async def plan(body: PlanRequest) -> PlanResponse:
        return planner.plan(body)

    return router


def _public_routes(serving: OpenAIServing) -> APIRouter:
    router = APIRouter()

    @router.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        if not serving.bridge.is_alive:
            raise engine_unavailable(serving.bridge.dead_reason or "not started")
        return Response(status_code=200)

    @router.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    @router.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(serving.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router


def _api_routes(serving: OpenAIServing) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> ModelList:
        return serving.models()

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> ModelCard:
        serving.check_model(model_id)
        return next(card for card in serving.models().data if card.id == model_id)

    @router.post("/v1/completions", response_model=CompletionResponse, responses=STREAM)
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse | StreamingResponse:
        return await serving.completion(body, request)

    @router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=STREAM)
    async def chat(body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse | StreamingResponse:
        return await serving.chat(body, request)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await serving.tokenize(body)

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await serving.detokenize(body)

    return router
