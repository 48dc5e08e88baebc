"""The routes that change what the server serves without a restart: LoRA adapters (vLLM's
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, their bodies) and the weights themselves (SGLang's
`POST /update_weights_from_disk`). Each runs on the engine-loop thread through the bridge; a weight update waits
until the requests in flight finished (on the old weights) and holds new ones until it is done. Errors are
OpenAI-style: 400 for an adapter or checkpoint that cannot be loaded, 404 for an unknown adapter, 409 for
unloading one that requests still run with. Knows nothing of the model beyond the engine's methods.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from diffuserve.engine import live_weights
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.engine.lora_adapters import AdapterInUse, AdapterNotFound
from diffuserve.server.bridge import AsyncEngine, EngineDeadError
from diffuserve.server.errors import APIError, bad_request, engine_unavailable


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None
    """Accepted for vLLM's clients; the name alone identifies the adapter."""


class UpdateWeightsFromDiskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_path: str
    load_format: str | None = None
    """Accepted for SGLang's clients: auto (or none) only; the checkpoint's safetensors are read."""


class UpdateWeightsResponse(BaseModel):
    success: bool
    message: str


def adapter_routes(bridge: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load(body: LoadLoRAAdapterRequest) -> str:
        await _call(bridge, lambda engine: engine.adapters.load(body.lora_name, body.lora_path))
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload(body: UnloadLoRAAdapterRequest) -> str:
        await _call(bridge, lambda engine: engine.unload_lora_adapter(body.lora_name))
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

    @router.post("/update_weights_from_disk")
    async def update_weights(body: UpdateWeightsFromDiskRequest) -> UpdateWeightsResponse:
        if body.load_format not in (None, "auto"):
            raise bad_request(f"load_format: {body.load_format!r} is not supported; use auto", "load_format")
        await _call(bridge, lambda engine: live_weights.update_weights(engine, body.model_path), when_idle=True)
        return UpdateWeightsResponse(success=True, message=f"Succeeded to update model weights from {body.model_path}")

    return router


async def _call(bridge: AsyncEngine, fn: Callable[[LLMEngine], object], when_idle: bool = False) -> None:
    """Runs `fn(engine)` on the engine-loop thread; its refusals become OpenAI-style errors."""
    try:
        await bridge.call(fn, when_idle)
    except AdapterNotFound as e:
        raise APIError(404, str(e), param=e.param, code=e.code) from e
    except AdapterInUse as e:
        raise APIError(409, str(e), param=e.param, code=e.code) from e
    except EngineDeadError as e:
        raise engine_unavailable(str(e)) from e
    except (ValueError, RuntimeError) as e:
        raise bad_request(str(e)) from e
