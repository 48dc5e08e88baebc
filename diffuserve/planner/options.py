"""PlanOptions: everything a plan is asked with, frozen, under the names of `diffuserve plan`'s flags. The CLI
fills it from its flags (`from_flags`), the server's POST /plan from the request body; both then call
`build.build_plan`. None means "not given": the calibration's value or the default applies (build.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from diffuserve.planner.inputs import CostInputs, Deployment

DEFAULT_HARDWARE = "H200"
DEFAULT_TPF = 2.5
DEFAULT_OUTPUT_TOKENS = 1024
HOST_POWER_SHARE = 0.4
"""Assumed host (CPU, memory, NIC, fans) power on top of each device's board power."""


@dataclass(frozen=True)
class PlanOptions:
    model: str | None = None
    """A preset name, a model directory or a config.json path."""
    calibrate: str | None = None
    """A `diffuserve bench` JSON whose measurements replace the defaults."""
    # hardware
    hardware: str | None = None
    memory_gib: float | None = None
    bandwidth_tbps: float | None = None
    tflops: float | None = None
    # deployment
    num_gpus: int | None = None
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    weight_dtype: str | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = Deployment.gpu_memory_utilization
    max_num_seqs: int = Deployment.max_num_seqs
    max_num_batched_tokens: int = Deployment.max_num_batched_tokens
    page_size: int | None = None
    runtime_overhead_gib: float | None = None
    activation_gib: float | None = None
    # workload
    context_length: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    concurrency: int | None = None
    request_rate: float | None = None
    block_length: int | None = None
    tpf: float | None = None
    decoder: str = "diffusion"
    """diffusion, or verified: TPF from verified_tpf, else acceptance_rate (planner/verified.py), else measured."""
    acceptance_rate: float | None = None
    verified_tpf: float | None = None
    experts_touched_fraction: float | None = None
    block_expert_coreset: str | int | None = None
    """The block expert coreset rule (model/layers/moe/coreset_rule.py): C experts per denoised block, 0 for
    per-token routing, or cumulative:T[,min=M][,window=W] (dMoE's); None: the model's config.json's, else off."""
    # efficiency
    bandwidth_fraction: float | None = None
    flops_fraction: float | None = None
    step_overhead_ms: float | None = None
    # cost
    gpu_hour_price: float | None = None
    capex_per_gpu: float | None = None
    years: float = CostInputs.amortization_years
    power_watts: float | None = None
    pue: float = CostInputs.pue
    electricity_price: float = CostInputs.electricity_price_per_kwh
    utilization: float = CostInputs.utilization

    @classmethod
    def from_flags(cls, flags: argparse.Namespace) -> PlanOptions:
        """The options `diffuserve plan`'s parsed flags give (every field is a flag of the same name)."""
        return cls(**{f.name: getattr(flags, f.name) for f in fields(cls)})
