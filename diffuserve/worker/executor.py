"""ModelExecutor: one rank's part of the model and everything its forward needs (the model shard, its heads of
every cache kind the model's layout declares, expert offload), and the forward itself. Every rank
runs this same class: rank 0's executor is called by the model runner and first sends the step's inputs to the
other ranks; a worker rank's executor sits in `loop()`, running each forward rank 0 sends until told to stop.
Knows nothing of requests, decoders or scheduling; the inputs are plain picklable tensors built by the model
runner on rank 0. Also owns whether the forward runs compiled (`CompiledForward`, `--enforce-eager`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from diffuserve.config import EngineConfig
from diffuserve.core.cache.manager import CacheSizes
from diffuserve.distributed.launcher import ParallelRuntime
from diffuserve.model.config import ModelArgs, parse_block_expert_coreset
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention_backends.selection import set_attention_backend
from diffuserve.model.layers.moe.coreset import set_block_coreset
from diffuserve.model.layers.moe.coreset_rule import CoresetRule, parse_coreset_rule, rule_from_config
from diffuserve.model.layers.moe.layer import set_moe_backend
from diffuserve.model.layers.moe.offload_context import OffloadContext, offload_context
from diffuserve.model.loader import load_model, read_model_config
from diffuserve.model.lora.layer import lora_context
from diffuserve.model.lora.slots import LoRASlots
from diffuserve.model.materialize import unpin_host_memory
from diffuserve.model.registry import cache_layout, family_of
from diffuserve.worker.cache.allocation import (
    CacheRequest,
    CacheTensors,
    allocate_caches,
    dtype_name,
    resolve_page_size,
)
from diffuserve.worker.cache.step_metadata import StepMetadata
from diffuserve.worker.experts import ExpertOffload

logger = logging.getLogger(__name__)


def model_dtype(model: DiffusionModel) -> torch.dtype:
    return next(model.parameters()).dtype


def should_compile(enforce_eager: bool | None, device: torch.device) -> bool:
    return not enforce_eager if enforce_eager is not None else device.type == "cuda"


BUCKET_STEP = 256


def engine_coreset_rule(config: EngineConfig, block_length: int) -> CoresetRule | None:
    """The flag's coreset rule, else config.json's (None: per-token routing). ValueError where the cumulative
    rule's windows would straddle forwards (the block length is not a multiple of the window)."""
    if config.block_expert_coreset is not None:
        rule = parse_coreset_rule(config.block_expert_coreset)
    else:
        model_config = read_model_config(config.model)[0]
        rule = rule_from_config(model_config, parse_block_expert_coreset(model_config))
    if rule is not None and rule.every_window and block_length % rule.window:
        raise ValueError(
            f"block_length: {block_length} is not a multiple of the coreset window {rule.window} "
            f"({rule.describe()}), so a window would straddle forwards; use --block-length {rule.window}"
        )
    return rule


def bucket_size(num_tokens: int) -> int:
    """The token count a bucketed forward runs at: the next power of two up to 256, then the next multiple of 256
    (at most 2x the rows for a small step, less than 256 extra rows for a large one)."""
    if num_tokens <= BUCKET_STEP:
        return 1 << max(0, num_tokens - 1).bit_length()
    return -(-num_tokens // BUCKET_STEP) * BUCKET_STEP


class CompiledForward:
    """`model`'s forward, compiled or not; call it as the model. `compile_s`: seconds spent in the first call.

    Default (`enforce_eager=None`): compiled on CUDA with `mode="reduce-overhead"` (CUDA graphs: the step's hundreds
    of small kernels replayed as one launch), eager on CPU, where inductor compiled the benchmark model for 105-144 s
    on a shared 2-core machine and ran fp32 at 0.63-0.69x eager (docs/benchmarks/latency.md, "Batch-1 speed");
    `enforce_eager=False` compiles on CPU too. The graph breaks at attention, at the GDN step and at the routed
    experts (whose Python structure and data-dependent shapes change every step: the families' `attend`,
    `HybridDecoderLayer.recurrent_mix`, `SparseMoeBlock._routed`), and the token count is dynamic, so no batch
    composition recompiles. The compiled pieces between the breaks see [N, ...] tensors only, so the number of
    tokens is their one varying dimension (the number of sequences reaches only the eager breaks). CUDA graphs
    record one graph per shape, so there (`bucketed`) the step's tokens are padded to `bucket_size`: a bounded
    set of shapes, recorded once each. Padding rows are token 0 at position 0; attention writes no K/V for them
    and returns zeros, the GDN step advances no state for them and returns zeros, and the caller reads the first
    N rows only. The first call pays the compile; its time is logged and kept in `compile_s`.
    """

    def __init__(
        self, model: DiffusionModel, compiled: bool, device: torch.device, bucketed: bool | None = None
    ) -> None:
        self.compiled = compiled
        self.bucketed = (compiled and device.type == "cuda") if bucketed is None else bucketed
        self.compile_s = 0.0
        self._first_call = compiled
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._fn: Callable[..., Any] = torch.compile(model, dynamic=True, mode=mode) if compiled else model

    def __call__(self, input_ids: torch.Tensor, *rest: Any) -> torch.Tensor:
        """input_ids [N] and the model's other arguments (positions [N], then the step's `StepInputs`) -> the
        model's output [N, ...]."""
        num_tokens = input_ids.shape[0]
        if self.bucketed:
            pad = bucket_size(num_tokens) - num_tokens
            input_ids, rest = F.pad(input_ids, (0, pad)), (F.pad(rest[0], (0, pad)), *rest[1:])
        if not self._first_call:
            return self._fn(input_ids, *rest)[:num_tokens]
        started = time.perf_counter()
        out = self._fn(input_ids, *rest)
        self.compile_s += time.perf_counter() - started
        self._first_call = False
        logger.info("compiled the model forward in %.1f s", self.compile_s)
        return out[:num_tokens]


class RankTask(Protocol):
    """Work rank 0 sends every rank besides the steps (worker/weight_update.py's `RankWeightUpdate`): picklable,
    run by each rank on its own executor."""

    def run(self, executor: ModelExecutor) -> None: ...


@dataclass(frozen=True)
class ForwardInputs:
    input_ids: torch.Tensor
    """[N] the step's query tokens, requests one after another (see model_runner)."""
    positions: torch.Tensor
    """[N] their absolute positions."""
    metadata: StepMetadata
    """The step's work per cache kind (worker/cache/step_metadata.py)."""
    offload: OffloadContext | None = None
    """The step's diffusion blocks for expert offload (which decides residency at a block's first step); built
    only when offload is on."""
    lora: torch.Tensor | None = None
    """[N] long: each token's LoRA adapter slot (0: the base model); None when no token of the step has one."""

    def to(self, device: torch.device | str) -> ForwardInputs:
        return ForwardInputs(
            self.input_ids.to(device),
            self.positions.to(device),
            self.metadata.to(device),
            self.offload,
            self.lora.to(device) if self.lora is not None else None,
        )


class ModelExecutor:
    """One rank's model part and the caches a forward needs (`caches`: every kind of the model's cache layout,
    this rank's heads of them). `runtime` is this rank's view of the parallel run (its group and the step
    channel; on rank 0 also the worker processes)."""

    def __init__(
        self,
        model: DiffusionModel,
        caches: CacheTensors,
        sizes: CacheSizes,
        offload: ExpertOffload | None,
        device: torch.device,
        runtime: ParallelRuntime | None = None,
        hidden_size: int = 0,
    ) -> None:
        self.model, self.offload = model, offload
        self.caches, self.sizes = caches, sizes
        self.page_size = sizes.page_size
        self.device = device
        self.runtime = runtime or ParallelRuntime()
        self._failure: str | None = None
        self._no_rows = torch.zeros(0, hidden_size, dtype=model_dtype(model), device=device)
        self.run_model = CompiledForward(model, False, device)
        """The forward a step calls: `model`, or its compiled form (see `build`)."""
        self.block_coreset: CoresetRule | None = None
        """The block expert coreset rule of the model's MoE layers (None: per-token routing); set by `build`."""
        self.lora: LoRASlots | None = None
        """The model's adapter slots (`--enable-lora`), else None; set by `build`."""

    @classmethod
    def build(
        cls, config: EngineConfig, args: ModelArgs, max_model_len: int, runtime: ParallelRuntime, device: torch.device
    ) -> ModelExecutor:
        """This rank's model part (experts in host memory under offload), expert cache and caches. Every rank
        calls it; the ranks agree on the cache sizes, since rank 0 hands out pages and slots for all of them."""
        group, offload = runtime.group, config.cache.expert_offload
        # The RoPE table covers the last block, which may reach past max_model_len.
        args, model = load_model(
            config.model,
            config.dtype,
            str(device),
            max_model_len + args.block_length,
            args,
            group,
            torch.device("cpu") if offload else None,
            config.load_format,
            config.seed,
            config.quant_scheme,
        )
        experts = (
            ExpertOffload(model, device, config.cache.expert_cache_memory, config.cache.expert_residency)
            if offload
            else None
        )
        sched = config.scheduler
        layout = cache_layout(args, dtype_name(model_dtype(model)))
        if config.cache.kv_cache_dtype != "auto":
            layout = layout.with_kv_dtype(config.cache.kv_cache_dtype)
        want = CacheRequest(
            config.cache,
            resolve_page_size(config.cache.page_size, model.step_rules.page_multiple(args.block_length)),
            sched.max_num_seqs,
            sched.max_num_batched_tokens,
            max_model_len,
            args.hidden_size,
            sched.max_num_batched_tokens * (args.hidden_size * 32 + args.vocab_size * 4),
        )
        caches, sizes = allocate_caches(layout, want, group, device)
        set_moe_backend(model, config.moe_backend)
        coreset = engine_coreset_rule(config, args.block_length)
        set_block_coreset(model, coreset)
        model.set_recurrent_backend(config.gdn_backend, device)
        set_attention_backend(model, config.attention_backend, device)
        executor = cls(model, caches, sizes, experts, device, runtime, args.hidden_size)
        executor.block_coreset = coreset
        lora = config.lora
        if lora.enable_lora or lora.draft_adapter:
            draft = lora.draft_adapter is not None
            executor.lora = LoRASlots(
                model, family_of(args), args, lora.max_loras, lora.max_lora_rank, model_dtype(model), device, draft
            )
            if executor.lora.draft_slot is not None and lora.draft_adapter is not None:
                executor.lora.load(executor.lora.draft_slot, "draft", lora.draft_adapter)
        # Offload's hooks and coreset routing (their block rows) stay eager; adapters too: their hooks read the
        # step's token slots from a context variable. The recurrent step is a graph break, as attention is.
        compiled = should_compile(config.enforce_eager, device) and not (offload or coreset or executor.lora)
        executor.run_model = CompiledForward(model, compiled, device)
        return executor

    def carried_rows(self) -> torch.Tensor:
        """[S, H] the hidden rows kept between steps (each state slot's last committed position), or [0, H]."""
        return self.caches.state.last_hidden if self.caches.state is not None else self._no_rows

    def execute(self, inputs: ForwardInputs) -> torch.Tensor:
        """Rank 0: sends the step to the other ranks, then runs its own forward -> hidden states [N, H].

        Under several processes a failed step ends the engine (the ranks' collectives no longer line up): this
        call and every later one raise the first failure, a worker's own error when it reported one."""
        if self.runtime.channel is None:
            return self.forward(inputs)
        if self._failure is not None:
            raise RuntimeError(f"the engine's ranks stopped after a failed step: {self._failure}")
        try:
            self.runtime.channel.send(inputs.to("cpu"))
            return self.forward(inputs)
        except Exception as e:
            self._failure = self.runtime.failure() or f"{type(e).__name__}: {e}"
            raise RuntimeError(self._failure) from e

    def ranks_failure(self) -> str | None:
        """Rank 0 of several processes: why the ranks can no longer run a step (a failed step, or a local worker
        that exited, even while idle), else None. Never touches a collective."""
        if self._failure is None and not self.runtime.closed:
            self._failure = self.runtime.lost_worker()
        return self._failure

    def forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """This rank's forward -> hidden states [N, H] (the same on every rank after the last all-reduce): each
        cache kind prepares its tensors (restores, resets), the model runs over all of them, each kind keeps what
        it carries to later steps."""
        self.caches.before_forward(inputs.metadata)
        step = self.caches.bind(inputs.metadata)
        with lora_context(inputs.lora) if inputs.lora is not None else nullcontext():  # adapters' token slots
            if inputs.offload is None:
                hidden = self.run_model(inputs.input_ids, inputs.positions, step)
            else:
                with offload_context(inputs.offload):
                    hidden = self.model(inputs.input_ids, inputs.positions, step)
        self.caches.after_forward(inputs.metadata, hidden)
        return hidden

    def loop(self) -> None:
        """Worker ranks: runs every forward rank 0 sends, and every task (`run_on_every_rank`), until it sends
        None (stop)."""
        assert self.runtime.channel is not None and self.runtime.group.rank > 0, "loop() is for worker ranks"
        with torch.inference_mode():
            while (message := self.runtime.channel.receive()) is not None:
                if isinstance(message, ForwardInputs):
                    self.forward(message.to(self.device))
                else:
                    message.run(self)

    def run_on_every_rank(self, task: RankTask) -> None:
        """Rank 0: runs `task` on every rank (sent to the others first, as a step is), e.g. a weight update."""
        if self.runtime.channel is not None:
            if self._failure is not None:
                raise RuntimeError(f"the engine's ranks stopped after a failed step: {self._failure}")
            self.runtime.channel.send(task)
        with torch.inference_mode():
            task.run(self)

    def close(self) -> None:
        """Rank 0: stops the worker ranks, if any, and unpins the host memory of offloaded experts (idempotent)."""
        self.runtime.close()
        unpin_host_memory(self.model)
