"""The wire models of the planner routes (`POST /plan`, `GET /plan/presets`): models only; plan_api.py runs them.

The request names the inputs of `diffuserve plan` that the web console's planner page offers, under the flags'
names; fields left out take the command's defaults. Unknown fields are refused (a misspelt input would
otherwise be planned with its default, silently).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from diffuserve.server.protocol import Int
from diffuserve.server.response_models import ResponseModel


class PlanRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)

    model: str
    """A model preset (GET /plan/presets), or the served model's name (its directory's config.json)."""
    hardware: str = "H200"
    """A hardware preset."""
    num_gpus: Int | None = None
    """Devices in total (default: tp x ep as needed)."""
    tensor_parallel_size: Int = 1
    expert_parallel_size: Int = 1
    weight_dtype: str | None = None
    """fp32, bf16 (default), fp16, fp8, int8 or int4."""
    kv_cache_dtype: str = "auto"
    """auto (the weights' dtype where the cache has it, else bf16), fp32, bf16, fp16 or fp8."""
    context_length: Int | None = None
    """Tokens per sequence (default: the model's maximum)."""
    concurrency: Int | None = None
    """Concurrent sequences (default: as many as fit)."""
    decoder: str = "diffusion"
    """diffusion, or verified (drafts checked against the causal path: `diffuserve plan --decoder verified`)."""
    verified_tpf: float | None = None
    """Verified decoding's output tokens per forward (default: from acceptance_rate, else the measured value)."""
    acceptance_rate: float | None = None
    """Verified decoding: the share of drafted tokens the causal check keeps, 0..1."""


class MemoryPartOut(ResponseModel):
    name: str
    bytes: float
    """Per device."""


class FitPointOut(ResponseModel):
    context_length: int
    sequences: int
    """Sequences of this length that fit the deployment."""
    full_attention_sequences: int | None
    """The same with every layer full attention (hybrid models; null otherwise)."""


class PlanResponse(ResponseModel):
    plan: dict[str, Any]
    """Exactly the document `diffuserve plan --json` prints for the same inputs."""
    summary: list[str]
    """The lines `diffuserve plan` prints."""
    sequences_that_fit: int
    """Sequences of the planned context that fit the whole deployment."""
    device_memory: list[MemoryPartOut]
    """One device's memory at the planned concurrency, bottom to top, adding up to the device."""
    fit_curve: list[FitPointOut]
    """Sequences that fit against the context length (doubling, with the planned context among them)."""


class PlanPresets(ResponseModel):
    models: list[str]
    """Model presets; the served model can be planned too, under its name."""
    served_model: str
    hardware: list[str]
    weight_dtypes: list[str]
    kv_cache_dtypes: list[str]
    default_model: str
    default_hardware: str
