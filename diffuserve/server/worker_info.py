"""What a gateway reads of a worker besides the OpenAI routes: SGLang's `/get_model_info` and `/get_server_info`
(and their newer spellings `/model_info` and `/server_info`, which SMG probes), under SGLang's field names where
SGLang has one and our own (`block_length`, `num_state_slots`, ...) where it has none, plus a
`diffuserve:cache_config_info` series whose `block_size` label is the page size (the KV-cache unit llm-d's
prefix scorer aligns to; vLLM exports the same under `vllm:cache_config_info`).

The static part is built once from the engine's settings when the app is built; the live load (SGLang's
`internal_states`) comes from the latest engine-stats snapshot the metrics observer received. Knows nothing of
how the engine computes either, nor of routing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from diffuserve import __version__
from diffuserve.server.config import ServerConfig
from diffuserve.server.metrics import ServerMetrics
from diffuserve.server.response_models import ResponseModel

if TYPE_CHECKING:
    from diffuserve.engine.llm_engine import LLMEngine

MODEL_INFO_PATHS = ("/get_model_info", "/model_info")
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")


class ModelInfo(ResponseModel):
    """SGLang's `/get_model_info` fields first, then the block-diffusion ones."""

    model_path: str
    tokenizer_path: str | None
    is_generation: bool = True
    preferred_sampling_params: dict[str, Any] | None = None
    weight_version: str | None = None
    has_image_understanding: bool = False
    has_audio_understanding: bool = False
    model_type: str | None
    architectures: list[str]
    served_model_name: str
    context_length: int
    """The longest prompt + completion a request may have (`max_model_len`)."""
    block_length: int
    """Positions denoised together (the diffusion block)."""
    page_size: int
    """Tokens per KV-cache page."""
    vocab_size: int
    num_experts: int
    num_experts_per_tok: int


class LoadState(ResponseModel):
    """One engine's live load, as of its latest step (zeros before the first step)."""

    num_running_reqs: int
    num_waiting_reqs: int
    token_usage: float
    """Fraction of KV-cache pages held by requests (SGLang's name; `kv_cache_usage_perc` in /metrics)."""
    state_slot_usage: float | None
    """Fraction of recurrent-state slots held (models with GDN layers), else null."""
    prefix_cache_hit_rate: float


class ServerInfo(ResponseModel):
    """SGLang's `/get_server_info` fields (its server arguments, scheduler limits and `internal_states`)."""

    version: str
    model_path: str
    tokenizer_path: str | None
    served_model_name: str
    host: str
    port: int
    context_length: int
    page_size: int
    max_total_num_tokens: int
    """KV-cache pages x page size: the tokens the cache holds at once."""
    max_running_requests: int
    """Sequences in one step (`--max-num-seqs`)."""
    chunked_prefill_size: int
    """Tokens in one step (`--max-num-batched-tokens`)."""
    max_prefill_tokens: int
    """Prefill tokens in one step while requests are decoding (`--max-prefill-tokens`, its default resolved)."""
    tp_size: int
    ep_size: int
    dp_size: int = 1
    """Always 1: a data-parallel replica is another server behind the gateway."""
    kv_cache_dtype: str
    dtype: str
    device: str
    disable_radix_cache: bool
    block_length: int
    num_state_slots: int
    internal_states: list[LoadState]


def worker_info_routes(engine: LLMEngine, config: ServerConfig, model_name: str, metrics: ServerMetrics) -> APIRouter:
    """The routes above, and the `cache_config_info` series in `metrics`' registry."""
    model_info = build_model_info(engine, model_name)
    static = _server_fields(engine, config, model_info)
    metrics.cache_config.labels(
        block_size=str(model_info.page_size),
        num_gpu_blocks=str(engine.pool.num_pages),
        cache_dtype=static["kv_cache_dtype"],
    ).set(1)
    router = APIRouter()

    async def get_model_info() -> ModelInfo:
        return model_info

    async def get_server_info() -> ServerInfo:
        return ServerInfo(**static, internal_states=[load_state(metrics)])

    for path in MODEL_INFO_PATHS:
        router.add_api_route(path, get_model_info, methods=["GET"])
    for path in SERVER_INFO_PATHS:
        router.add_api_route(path, get_server_info, methods=["GET"])
    return router


def build_model_info(engine: LLMEngine, model_name: str) -> ModelInfo:
    args, model_dir = engine.args, Path(engine.config.model)
    return ModelInfo(
        model_path=str(model_dir),
        tokenizer_path=str(model_dir) if engine.tokenizer is not None else None,
        model_type=_config_json(model_dir).get("model_type"),
        architectures=[args.architecture],
        served_model_name=model_name,
        context_length=engine.max_model_len,
        block_length=args.block_length,
        page_size=engine.pool.page_size,
        vocab_size=args.vocab_size,
        num_experts=args.num_experts,
        num_experts_per_tok=args.num_experts_per_tok,
    )


def load_state(metrics: ServerMetrics) -> LoadState:
    stats = metrics.latest_stats
    if stats is None:
        return LoadState(
            num_running_reqs=0, num_waiting_reqs=0, token_usage=0.0, state_slot_usage=None, prefix_cache_hit_rate=0.0
        )
    state = stats.state
    return LoadState(
        num_running_reqs=stats.num_running,
        num_waiting_reqs=stats.num_waiting,
        token_usage=stats.kv_usage,
        state_slot_usage=state.slots_used / state.slots_total if state is not None and state.slots_total else None,
        prefix_cache_hit_rate=stats.prefix_hit_rate,
    )


def _server_fields(engine: LLMEngine, config: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    engine_config = engine.config
    slots = engine.state_pool
    return {
        "version": __version__,
        "model_path": info.model_path,
        "tokenizer_path": info.tokenizer_path,
        "served_model_name": info.served_model_name,
        "host": config.host,
        "port": config.port,
        "context_length": info.context_length,
        "page_size": info.page_size,
        "max_total_num_tokens": engine.pool.num_pages * info.page_size,
        "max_running_requests": engine_config.scheduler.max_num_seqs,
        "chunked_prefill_size": engine_config.scheduler.max_num_batched_tokens,
        "max_prefill_tokens": engine.scheduler.max_prefill_tokens,
        "tp_size": engine_config.parallel.tensor_parallel_size,
        "ep_size": engine_config.parallel.tensor_parallel_size if engine_config.parallel.enable_expert_parallel else 1,
        "kv_cache_dtype": engine_config.cache.kv_cache_dtype,
        "dtype": engine_config.dtype,
        "device": engine_config.device,
        "disable_radix_cache": not engine_config.cache.enable_prefix_caching,
        "block_length": info.block_length,
        "num_state_slots": slots.num_slots if slots is not None else 0,
    }


def _config_json(model_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
