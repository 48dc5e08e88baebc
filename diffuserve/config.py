"""Engine configuration: frozen dataclasses, one per subsystem, each field documented by the string beneath it.

The same docstrings become the CLI's `--help` (`add_config_arguments`), and `EngineConfig.from_kwargs` routes
flat keyword arguments (as `LLM(model, max_num_seqs=...)` takes them) to the right sub-config, rejecting unknown
names with the list of valid ones. Values that depend on the model ("auto", None) are resolved later by building
new objects with `dataclasses.replace`; nothing here is ever mutated.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from diffuserve.model.layers.moe.coreset_rule import parse_coreset_rule
from diffuserve.model.quant.scheme import DEFAULT_TARGETS, QuantScheme, make_scheme
from diffuserve.sampling_defaults import DECODER_NAMES


def _positive(name: str, value: int | float | None, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    page_size: int | None = None
    """Tokens per KV-cache page; must be a multiple of the block length (default: smallest multiple >= 16)."""
    num_pages: int | None = None
    """Number of KV-cache pages; overrides --kv-cache-memory when set."""
    kv_cache_memory: int | None = None
    """KV-cache budget in bytes, K/V pages only (default on CPU: what max_num_seqs sequences of max_model_len need,
    at most 4 GiB). Hybrid models' recurrent state has its own --state-cache-memory."""
    kv_cache_dtype: str = "auto"
    """K/V pages' dtype: auto (the model's dtype) or fp8 (e4m3, one scale of 1.0 per tensor, vLLM's default: half
    of bf16's bytes; attention reads them back in the model's dtype). The GDN state stays fp32 (docs/serving/
    quantization.md)."""
    state_cache_memory: int | None = None
    """Hybrid models (Gated DeltaNet layers) only: bytes of the recurrent-state pool, separate from (and allocated
    before) --kv-cache-memory, which covers K/V pages only. One slot holds a sequence's whole GDN state whatever
    its length; each running sequence takes one, spare slots keep prefix snapshots (default: 2 x max_num_seqs
    slots with prefix caching, else max_num_seqs)."""
    state_snapshot_interval: int = 4
    """Hybrid models with prefix caching: snapshot a sequence's recurrent state every this many KV pages of its
    committed prefix (and at the last page boundary of its prompt), so a later request sharing the prefix
    restores it."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the engine may use (weights + activations + KV cache) when no budget is given."""
    enable_prefix_caching: bool = True
    """Reuse the KV pages of a shared prompt prefix across requests."""
    expert_offload: bool = False
    """MoE models: keep the routed experts' weights in host memory and only the hot ones in a device-resident
    expert cache; missed experts are fetched or computed on the host, whichever is cheaper (exact)."""
    expert_cache_memory: int | None = None
    """Device bytes for the expert cache under --expert-offload, split evenly over the MoE layers (default: room
    for a quarter of each layer's experts)."""
    expert_residency: str = "block"
    """Which experts the expert cache holds: block (chosen from each diffusion block's first step and kept for
    its later steps) or step (re-chosen every step, as autoregressive offloaders do)."""

    def __post_init__(self) -> None:
        _positive("page_size", self.page_size)
        _positive("num_pages", self.num_pages)
        _positive("kv_cache_memory", self.kv_cache_memory)
        _positive("state_cache_memory", self.state_cache_memory)
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(
                f"kv_cache_dtype: must be auto or fp8 (e4m3), got {self.kv_cache_dtype!r}; use --kv-cache-dtype fp8"
            )
        _positive("state_snapshot_interval", self.state_snapshot_interval, allow_none=False)
        _positive("expert_cache_memory", self.expert_cache_memory)
        if self.expert_residency not in ("block", "step"):
            raise ValueError(f"expert_residency: must be block or step, got {self.expert_residency!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    """Most requests denoised together in one step."""
    max_num_batched_tokens: int = 4096
    """Token budget of one step (current blocks + commit tokens + prefill chunks)."""
    max_prefill_tokens: int | None = None
    """Prefill tokens of one step (prompt chunks and recomputes after preemption, whole blocks, at least one) while
    any running request is decoding, a part of max_num_batched_tokens: a step that prefills arriving prompts beside
    them delays their next tokens by its own length, so a smaller share keeps their inter-token latency steady and
    spreads the prompts over more steps (with none decoding, prefill takes the whole step). Default: 256 on a CPU
    (measured), max_num_batched_tokens on a GPU (core/step_budget.py default_prefill_tokens)."""
    fused_commit: bool = True
    """Write a finished block's K/V in the same forward as the next block's first step (exact). Off: a separate
    commit forward per block, as other engines do (kept for comparison benchmarks)."""
    auto_draft_tokens: int | None = None
    """decoder=auto: its requests draft (verified decoding) while all of them drafting puts at most this many
    tokens into a step (2 x block length each), and decide only their next token (autoregressive decoding) past
    it; the tokens are the same either way (core/draft_switch.py). 0: never draft. Default: 2 x block length on
    a CPU (one request drafts; measured), 512 on a GPU (an estimate, not measured)."""

    def __post_init__(self) -> None:
        _positive("max_num_seqs", self.max_num_seqs, allow_none=False)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens, allow_none=False)
        _positive("max_prefill_tokens", self.max_prefill_tokens)
        if self.auto_draft_tokens is not None and self.auto_draft_tokens < 0:
            raise ValueError(f"auto_draft_tokens: must be >= 0 (0: auto never drafts), got {self.auto_draft_tokens}")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Processes that split attention heads, dense layers and experts (torch.distributed: gloo on CPU, NCCL on
    GPUs). Started as worker processes by the engine itself, or by torchrun (one process per rank)."""
    enable_expert_parallel: bool = False
    """Split the experts of MoE layers whole across the tensor-parallel processes (E / size each) instead of
    slicing each expert's width."""

    def __post_init__(self) -> None:
        _positive("tensor_parallel_size", self.tensor_parallel_size, allow_none=False)


@dataclass(frozen=True)
class LoRAConfig:
    enable_lora: bool = False
    """Serve LoRA adapters (PEFT format) beside the base model, chosen per request (docs/serving/adapters.md)."""
    lora_modules: list[str] | None = None
    """Adapters loaded at start, as name=path (PEFT adapter directories); requests select one by its name."""
    max_loras: int = 4
    """With --enable-lora: adapters held at once (each takes one slot of every linear it adapts)."""
    max_lora_rank: int = 16
    """With --enable-lora: the largest adapter rank r accepted (smaller ranks are padded to it)."""
    draft_adapter: str | None = None
    """A PEFT adapter directory applied only where verified decoding drafts (decoder=verified or auto, requests
    without an adapter of their own), never to the causal rows that verify: it can raise the acceptance, and the
    output stays the base model's (docs/serving/adapters.md)."""

    def __post_init__(self) -> None:
        _positive("max_loras", self.max_loras, allow_none=False)
        _positive("max_lora_rank", self.max_lora_rank, allow_none=False)
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules: adapters need --enable-lora; add it")
        for module in self.lora_modules or ():
            if "=" not in module or not module.split("=", 1)[0] or not module.split("=", 1)[1]:
                raise ValueError(
                    f"lora_modules: {module!r} is not name=path; pass e.g. --lora-modules sql=/adapters/sql"
                )


@dataclass(frozen=True)
class EngineConfig:
    model: str
    """Model directory (Hugging Face style: config.json, safetensors, tokenizer)."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (the checkpoint's), float32, bfloat16 or float16."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    max_model_len: int | None = None
    """Longest prompt + generation in tokens (default: the model's max_position_embeddings, at most 32768)."""
    block_length: int | None = None
    """Diffusion block length (default: the model's block_length)."""
    seed: int = 0
    """Seed of requests that set none."""
    load_format: str = "auto"
    """auto: the checkpoint's safetensors; dummy: seeded random weights made on the device, no weight files
    needed (benchmarks of shapes without a checkpoint)."""
    moe_backend: str = "auto"
    """How MoE layers compute their experts: auto (picked per call by measurement, see docs/serving/moe.md), loop (one
    matmul pair per touched expert: the reference), bmm (padded batched GEMM over all experts) or grouped_mm."""
    gdn_backend: str = "auto"
    """Hybrid models (Gated DeltaNet layers): what runs the causal GDN conv and delta rule. auto: the CUDA kernels
    of flash-linear-attention and causal-conv1d on a CUDA device where they are installed (the cuda-kernels
    extra), torch otherwise; torch: ours everywhere; fla: the kernels, an error where they cannot run."""
    attention_backend: str = "auto"
    """What computes the paged attention of a step (model/layers/attention_backends). auto: flashinfer on a CUDA
    device where FlashInfer is installed (the cuda-kernels extra) and the dtype is float16 / bfloat16, batched
    otherwise; loop: one SDPA per sequence (the reference); batched: the step's sequences in a few padded SDPA
    calls; flashinfer: FlashInfer's varlen paged kernel, an error where it cannot run."""
    enforce_eager: bool | None = None
    """Run the model forward eagerly instead of through torch.compile (vLLM's flag). Default: compiled on CUDA
    (CUDA graphs), eager on CPU, where compiling took about 2 minutes and ran fp32 slower (docs/benchmarks/latency.md);
    false compiles on CPU too."""
    quantization: str | None = None
    """Quantize a 16/32-bit checkpoint's weights while loading (weight-only; vLLM's flag): int8 (per output
    channel, symmetric), int4 (groups of --quantization-group-size input columns, asymmetric) or fp8 (e4m3, per
    output channel). Pre-quantized checkpoints (FP8, GPTQ, AWQ, compressed-tensors) load as they are, without it."""
    quantization_targets: str = DEFAULT_TARGETS
    """With --quantization: which weights, comma-separated: experts, shared_expert, dense_mlp, attention, gdn,
    lm_head, or all. Norms, routers, embeddings and the GDN gates and conv stay 16/32-bit
    (docs/serving/quantization.md)."""
    quantization_group_size: int = 128
    """With --quantization int4: input columns sharing one scale and zero point (must divide every quantized
    weight's input width)."""
    strict_config: bool = False
    """A config.json key or checkpoint tensor that looks like a diffusion or routing setting the engine does not
    implement (or any key it does not know) is an error instead of a warning at load."""
    block_expert_coreset: str | int | None = None
    """MoE models: the block expert coreset rule (docs/models/coreset.md). An integer C: while a block is denoised, each
    MoE layer routes the block's positions within the C experts with the largest summed router probability
    (commits keep per-token routing; 0 = off). `cumulative:T[,min=M][,window=W]` (dMoE's rule, T in (0, 1]): every
    window of W positions (32) of every forward routes within the experts covering a share T of its positions'
    top-k votes, at least M (16). Default: the model's config.json (the keys docs/models/coreset.md lists, or dMoE's
    `core_threshold`), else off."""
    default_decoder: str | None = None
    """The decoder of requests that name none (`SamplingParams.decoder`), e.g. auto; default: the model's
    generation_config.json, else threshold (renoise for DiffusionGemma)."""
    expert_stats: bool | None = None
    """Keep MoE routing statistics (experts touched per step and per block, load imbalance: /metrics and
    `bench`). Each step copies every MoE layer's routing to the host, so the default is on where they are
    reported (`diffuserve serve`, `bench`) and off in the offline `LLM`."""
    overlap_outputs: bool = False
    """Make a step's outputs (detokenization, stop strings, logprob text) on a second thread while the next step's
    forward runs (engine/output_overlap.py): the same outputs, each one step later. Measured in
    docs/benchmarks/throughput.md."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        _positive("max_model_len", self.max_model_len)
        _positive("block_length", self.block_length)
        parse_coreset_rule(self.block_expert_coreset or 0)  # a bad value fails here, with its one-line reason
        if self.default_decoder is not None and self.default_decoder not in DECODER_NAMES:
            names = ", ".join(DECODER_NAMES)
            raise ValueError(f"default_decoder: must be one of {names}, got {self.default_decoder!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format: must be auto or dummy, got {self.load_format!r}")
        if self.moe_backend not in ("auto", "loop", "bmm", "grouped_mm"):
            raise ValueError(f"moe_backend: must be auto, loop, bmm or grouped_mm, got {self.moe_backend!r}")
        if self.gdn_backend not in ("auto", "torch", "fla"):
            raise ValueError(f"gdn_backend: must be auto, torch or fla, got {self.gdn_backend!r}")
        if self.attention_backend not in ("auto", "loop", "batched", "flashinfer"):
            raise ValueError(
                f"attention_backend: must be auto, loop, batched or flashinfer, got {self.attention_backend!r}"
            )
        if self.lora.enable_lora and self.parallel.tensor_parallel_size > 1:
            raise ValueError(
                f"enable_lora: adapters run on one rank only, not tensor_parallel_size "
                f"{self.parallel.tensor_parallel_size}; use --tensor-parallel-size 1 or drop --enable-lora"
            )
        scheme = self.quant_scheme
        if self.cache.expert_offload and scheme.method is not None and "experts" in scheme.targets:
            raise ValueError(
                "expert_offload: offloading quantized experts is not supported yet; drop --expert-offload or "
                "leave experts out of --quantization-targets"
            )

    @property
    def quant_scheme(self) -> QuantScheme:
        """The validated quantize-on-load request (method None: none)."""
        return make_scheme(self.quantization, self.quantization_targets, self.quantization_group_size)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        """Routes flat keyword arguments to the sub-configs; unknown names raise with the valid ones."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in _SUB_CONFIGS}
        top: dict[str, Any] = {}
        for key, value in kwargs.items():
            owner = _owner_of(key)
            if owner is None:
                valid = sorted(_flat_field_names())
                raise ValueError(f"unknown engine option {key!r}; valid options: {', '.join(valid)}")
            (top if owner == "" else groups[owner])[key] = value
        subs = {name: sub_cls(**groups[name]) for name, sub_cls in _SUB_CONFIGS.items()}
        return cls(model=model, **top, **subs)

    def to_kwargs(self) -> dict[str, Any]:
        """Inverse of `from_kwargs` (without `model`)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _SUB_CONFIGS}
        flat.pop("model")
        for name in _SUB_CONFIGS:
            flat.update(dataclasses.asdict(getattr(self, name)))
        return flat


_SUB_CONFIGS = {
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
    "lora": LoRAConfig,
}


def _owner_of(key: str) -> str | None:
    if key in {f.name for f in dataclasses.fields(EngineConfig)} - set(_SUB_CONFIGS) - {"model"}:
        return ""
    for name, sub_cls in _SUB_CONFIGS.items():
        if key in {f.name for f in dataclasses.fields(sub_cls)}:
            return name
    return None


def _flat_field_names() -> list[str]:
    names = [f.name for f in dataclasses.fields(EngineConfig) if f.name not in _SUB_CONFIGS and f.name != "model"]
    for sub_cls in _SUB_CONFIGS.values():
        names += [f.name for f in dataclasses.fields(sub_cls)]
    return names


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring written beneath it} (read from the class source)."""
    class_def = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(class_def, ast.ClassDef), "the source of a class is one class definition"
    body = class_def.body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            assert isinstance(node.target, ast.Name), "an annotated name in a class body is a field"
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Adds one `--flag` per dataclass field (recursing into sub-configs); help text = the field docstring."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name in _SUB_CONFIGS:
            add_config_arguments(parser, _SUB_CONFIGS[f.name], skip)
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        type_name = str(f.type)
        is_list = type_name.startswith("list[")
        if is_list:
            type_name = type_name[len("list[") :]
        parsers: dict[str, Callable[[str], Any]] = {"bool": parse_bool, "int": int, "float": float}
        kind = parsers.get(type_name.split(" ")[0].rstrip("]"), str)
        # A bare boolean flag means true (`--enforce-eager`, as vLLM spells it); `--flag false` still works.
        shape: dict[str, Any] = (
            {"nargs": "?", "const": True} if kind is parse_bool else {"nargs": "+" if is_list else None}
        )
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            **shape,
            metavar=f.name.upper() if kind is not parse_bool else "{true,false}",
            help=docs.get(f.name, "") + ("" if default is None else f" (default: {default})"),
        )


QUANTIZATION_FIELDS = ("quantization", "quantization_targets", "quantization_group_size")


def add_quantization_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the --quantization flags of EngineConfig (commands that take no other engine option)."""
    skip = tuple(name for name in _flat_field_names() if name not in QUANTIZATION_FIELDS)
    add_config_arguments(parser, EngineConfig, skip=(*skip, "model"))


def engine_config_from_args(model: str, args: argparse.Namespace) -> EngineConfig:
    """Builds an EngineConfig from the flags `add_config_arguments(parser, EngineConfig)` defined."""
    known = set(_flat_field_names())
    return EngineConfig.from_kwargs(model, **{k: v for k, v in vars(args).items() if k in known})
