"""The planner's frozen inputs besides model and hardware: deployment, workload, efficiency and cost knobs.

Owns their defaults (each documented beneath the field) and the checks that need no model: positive sizes,
fractions in (0, 1], known dtypes. Checks that need the model (context above its maximum, parallel sizes that do
not divide heads or experts) live in `check_fits_model`. Every error names the field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from diffuserve.planner.model_spec import ModelSpec

WEIGHT_BYTES = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0 + 4 / 2048,
    "int8": 1.0 + 2 / 2048,
    "int4": 0.5 + 4 / 128,
}
"""Bytes per weight, scales included, as the engine stores them (model/quant): FP8 one fp32 scale per output
channel, INT8 one bf16 scale per output channel (both shown for 2048 input columns), INT4 a bf16 scale and zero
per group of 128. Memory takes quantized weights matrix by matrix instead (planner/quantized_weights.py: the real
widths, and the norms, routers and gates that stay 16-bit)."""
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DECODERS = {
    "diffusion": "the threshold decoder and the like: TPF as given (--tpf)",
    "verified": "drafts checked against the causal path (planner/verified.py)",
}
"""What a plan's decoding is (`--decoder`)."""


@dataclass(frozen=True)
class Deployment:
    num_gpus: int = 1
    """Devices in the deployment; replicas = num_gpus / tensor_parallel_size."""
    tensor_parallel_size: int = 1
    """Devices one replica's attention and dense layers are split over (must divide the attention heads)."""
    expert_parallel_size: int = 1
    """Devices the routed experts are split over, whole experts each (1 = experts sliced by tensor parallel)."""
    weight_dtype: str = "bf16"
    """fp32, bf16, fp16, fp8, int8 or int4 (quantized as the engine's --quantization does: embeddings, LM head,
    norms and routers stay bf16)."""
    kv_dtype: str = "bf16"
    """KV-cache element type: fp32, bf16, fp16 or fp8."""
    gpu_memory_utilization: float = 0.9
    """Fraction of device memory the engine may use (diffuserve's default)."""
    max_num_seqs: int = 64
    """Most sequences denoised in one step (diffuserve's default); sizes the logits workspace."""
    max_num_batched_tokens: int = 4096
    """Token budget of one step (diffuserve's default); sizes the activation workspace."""
    page_size: int | None = None
    """KV page in tokens (default: the smallest multiple of the block length >= 16, as the engine picks)."""
    runtime_overhead_bytes: int | None = None
    """Override of the runtime's own memory (default: the hardware preset's, + 2 GiB NCCL when parallel)."""
    activation_bytes: int | None = None
    """Override of the activation + logits workspace estimate (e.g. what the engine logs at start-up)."""

    def __post_init__(self) -> None:
        for name in (
            "num_gpus",
            "tensor_parallel_size",
            "expert_parallel_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "page_size",
        ):
            _positive(name, getattr(self, name))
        _choice("weight_dtype", self.weight_dtype, WEIGHT_BYTES)
        _choice("kv_dtype", self.kv_dtype, KV_BYTES)
        _fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        for name in ("runtime_overhead_bytes", "activation_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}: must be >= 0, got {value}")

    @property
    def num_replicas(self) -> int:
        return self.num_gpus // self.tensor_parallel_size

    @property
    def expert_shards(self) -> int:
        """Ways the routed experts are split: by whole experts (EP) or by slicing each expert (TP)."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)


@dataclass(frozen=True)
class Workload:
    context_length: int
    """Tokens a sequence may reach (prompt + output): what capacity is sized for."""
    prompt_tokens: int
    output_tokens: int
    block_length: int
    """Diffusion block length S: positions denoised together in every forward of a sequence."""
    tpf: float = 2.5
    """Tokens committed per forward per sequence (TPF = generated tokens / NFE); measure it with bench. Under
    decoder verified: the output tokens per forward, drafting and discarded forwards included (planner/verified.py)."""
    decoder: str = "diffusion"
    """diffusion (the threshold decoder and the like) or verified (drafts checked against the causal path: a GDN
    model holds one more copy of its state per sequence)."""
    tpf_source: str = ""
    """Where `tpf` comes from, for the report (empty: given or the default)."""
    concurrency: int | None = None
    """Sequences decoding together (default: as many as fit, at most max_num_seqs)."""
    request_rate: float | None = None
    """Arriving requests per second to size the deployment for (Little's law)."""
    experts_touched_fraction: float | None = None
    """Override of the fraction of routed experts one forward reads (default: 1 - (1 - k/E)^T)."""
    experts_touched_per_block: float | None = None
    """Measured distinct experts one block's tokens route to, per MoE layer (from a calibration)."""
    block_expert_coreset: int = 0
    """Block expert coreset routing: while a block is denoised, each MoE layer routes its positions to at most
    this many experts (0: off, every position to its own top-k)."""
    coreset_rule: str = ""
    """The cumulative coreset rule `block_expert_coreset` estimates (planner/coreset.py), for the report; empty for
    the fixed rule."""

    def __post_init__(self) -> None:
        for name in (
            "context_length",
            "prompt_tokens",
            "output_tokens",
            "block_length",
            "tpf",
            "concurrency",
            "request_rate",
            "experts_touched_per_block",
        ):
            _positive(name, getattr(self, name))
        if self.experts_touched_fraction is not None:
            _fraction("experts_touched_fraction", self.experts_touched_fraction)
        _choice("decoder", self.decoder, DECODERS)
        if self.block_expert_coreset < 0:
            raise ValueError(f"block_expert_coreset: must be >= 0 (0 turns it off), got {self.block_expert_coreset}")
        if self.tpf > self.block_length:
            raise ValueError(
                f"tpf: {self.tpf} tokens per forward exceeds the block length {self.block_length}; "
                "a forward commits at most one block per sequence"
            )
        if self.prompt_tokens + self.output_tokens > self.context_length:
            raise ValueError(
                f"prompt_tokens + output_tokens = {self.prompt_tokens + self.output_tokens} exceeds "
                f"context_length {self.context_length}; raise --context-length or shorten the request"
            )

    @property
    def mean_context(self) -> float:
        """Visible context averaged over a request's decode: the prompt plus half the output."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True)
class Efficiency:
    bandwidth_fraction: float = 0.8
    """Achieved / peak memory bandwidth (MBU); aiconfigurator's H200 scaling factor is 0.8."""
    flops_fraction: float = 0.5
    """Achieved / peak matmul FLOP/s (MFU); 0.4-0.7 is typical for inference GEMMs."""
    step_overhead_s: float = 1e-3
    """Fixed time per forward beyond the roofline (launches, scheduler, sampling); calibrate it."""

    def __post_init__(self) -> None:
        _fraction("bandwidth_fraction", self.bandwidth_fraction)
        _fraction("flops_fraction", self.flops_fraction)
        if self.step_overhead_s < 0:
            raise ValueError(f"step_overhead_s: must be >= 0, got {self.step_overhead_s}")


@dataclass(frozen=True)
class CostInputs:
    gpu_hour_price: float
    """Cloud price of one device-hour."""
    capex_per_gpu: float
    """Purchase price of one device with its share of server, network and installation."""
    amortization_years: float = 4.0
    power_watts_per_gpu: float = 1000.0
    """Wall power of one device with its host share (board TDP x 1.4 by default)."""
    pue: float = 1.4
    """Data-centre power usage effectiveness (cooling and distribution on top of IT power)."""
    electricity_price_per_kwh: float = 0.12
    utilization: float = 0.5
    """Fraction of hours the deployment serves at the planned throughput (0.3-0.7 is realistic)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "utilization" and getattr(self, f.name) < 0:
                raise ValueError(f"{f.name}: must be >= 0, got {getattr(self, f.name)}")
        _positive("amortization_years", self.amortization_years)
        _fraction("utilization", self.utilization)


def check_fits_model(spec: ModelSpec, deployment: Deployment, workload: Workload) -> None:
    """Raises ValueError when the deployment or workload contradict the model's shape."""
    if workload.context_length > spec.max_position_embeddings:
        raise ValueError(
            f"context_length: {workload.context_length} exceeds {spec.name}'s maximum of "
            f"{spec.max_position_embeddings} tokens (max_position_embeddings); use --context-length "
            f"{spec.max_position_embeddings} or less"
        )
    tp, ep = deployment.tensor_parallel_size, deployment.expert_parallel_size
    for size, name in ((tp, "tensor_parallel_size"), (ep, "expert_parallel_size")):
        if deployment.num_gpus % size:
            raise ValueError(f"{name}: {size} does not divide num_gpus {deployment.num_gpus}")
    if spec.num_heads % tp:
        raise ValueError(
            f"tensor_parallel_size: {tp} does not divide the {spec.num_heads} attention heads of {spec.name}; "
            f"use one of {_divisors(spec.num_heads)}"
        )
    for group in spec.attention:
        if group.num_kv_heads % tp and tp % group.num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size: {tp} neither divides nor is a multiple of the {group.num_kv_heads} KV "
                f"heads of {spec.name}; use one of {_divisors(group.num_kv_heads)} or a multiple of it"
            )
    gdn = spec.linear_attention
    if gdn is not None and gdn.num_key_heads % tp:
        # TP splits a GDN layer by key head, each with its Hv / Hk value heads and their state.
        raise ValueError(
            f"tensor_parallel_size: {tp} does not divide the {gdn.num_key_heads} linear-attention key heads of "
            f"{spec.name}; use one of {_divisors(gdn.num_key_heads)}"
        )
    if ep > 1 and (not spec.is_moe or spec.num_experts % ep):
        raise ValueError(
            f"expert_parallel_size: {ep} does not divide the {spec.num_experts} experts of {spec.name}; "
            f"use one of {_divisors(spec.num_experts) if spec.is_moe else [1]}"
        )
    if ep % tp and tp % ep:
        raise ValueError(f"expert_parallel_size: {ep} and tensor_parallel_size {tp} must divide one another")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and d <= 64]


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name}: must be > 0, got {value}")


def _fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name}: must be in (0, 1], got {value}")


def _choice(name: str, value: str, allowed: dict) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
