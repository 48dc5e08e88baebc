"""ModelExecutor: one rank's part of the model and everything its forward needs (the model shard, the KV cache of
its KV heads, the recurrent-state pool of a hybrid model, expert offload), and the forward itself. Every rank
runs this same class: rank 0's executor is called by the model runner and first sends the step's inputs to the
other ranks; a worker rank's executor sits in `loop()`, running each forward rank 0 sends until told to stop.
Knows nothing of requests, decoders or scheduling; the inputs are plain picklable tensors built by the model
runner on rank 0. Also owns whether the forward runs compiled (`CompiledForward`, `--enforce-eager`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from diffuserve.config import EngineConfig
from diffuserve.distributed.group import agree_min
from diffuserve.distributed.launcher import ParallelRuntime
from diffuserve.engine.experts import ExpertOffload
from diffuserve.engine.kv_cache import allocate_kv_cache, num_pages_for, resolve_page_size, spec_for
from diffuserve.engine.state_cache import StateCache, StateCacheSpec, has_recurrent_state, num_slots_for
from diffuserve.model.config import ModelArgs
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention import PagedAttentionInputs, SequenceSlice
from diffuserve.model.layers.gated_deltanet import set_gdn_backend
from diffuserve.model.layers.gdn_rescan import GdnRescan
from diffuserve.model.layers.gdn_step import RecurrentStepInputs, RowGroup
from diffuserve.model.layers.moe.layer import set_moe_backend
from diffuserve.model.layers.moe.offload_context import OffloadContext, offload_context
from diffuserve.model.loader import load_model

logger = logging.getLogger(__name__)


def should_compile(enforce_eager: bool | None, device: torch.device) -> bool:
    return not enforce_eager if enforce_eager is not None else device.type == "cuda"


BUCKET_STEP = 256


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
    on a shared 2-core machine and ran fp32 at 0.63-0.69x eager (docs/benchmarks.md, "Batch-1 speed");
    `enforce_eager=False` compiles on CPU too. The graph breaks at attention and at the routed experts (whose
    Python structure and data-dependent shapes change every step: `Attention.attend`, `SparseMoeBlock._routed`),
    and the token count is dynamic, so no batch composition recompiles. CUDA graphs record one graph per shape,
    so there (`bucketed`) the step's tokens are padded to `bucket_size`: a bounded set of shapes, recorded once
    each. Padding rows are token 0 at position 0; attention writes no K/V for them and returns zeros, and the
    caller reads the first N rows only. The first call pays the compile; its time is logged and kept in
    `compile_s`.
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
        """input_ids [N] and the model's other arguments (positions [N] first) -> the model's output [N, ...]."""
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


@dataclass(frozen=True)
class StatePlan:
    """A step's recurrent-state work (hybrid models; see model/layers/gdn_step). Built by the model runner."""

    commits: tuple[RowGroup, ...]
    blocks: RowGroup | None
    preview: bool
    reset: torch.Tensor
    """[S] slots set to the empty prefix's state before the forward (sequences starting at position 0)."""
    restore: tuple[torch.Tensor, torch.Tensor] | None
    """(snapshot slots, sequence slots): prefix-cache hits copied in before the forward."""
    last_rows: torch.Tensor
    """[S] the batch row of each committing sequence's last commit token ..."""
    last_slots: torch.Tensor
    """[S] ... and its slot: that row's final hidden state is kept as the slot's `last_hidden`."""
    rescan: GdnRescan | None = None
    """`--recurrent-state rescan` only: the kept projections the GDN layers rebuild the state from."""


@dataclass(frozen=True)
class ForwardInputs:
    input_ids: torch.Tensor
    """[N] the step's query tokens, requests one after another (see model_runner)."""
    positions: torch.Tensor
    """[N] their absolute positions."""
    slot_mapping: torch.Tensor
    """[N] the KV-cache slot each token's K/V is written to."""
    sequences: tuple[SequenceSlice, ...]
    offload: OffloadContext | None = None
    """The step's diffusion blocks for expert offload (which decides residency at a block's first step); built
    only when offload is on."""
    state: StatePlan | None = None
    """Hybrid models: the GDN layers' slots and row groups (the recompute path refuses several ranks, so this
    never travels to a worker)."""

    def to(self, device: torch.device | str) -> ForwardInputs:
        sequences = tuple(
            dataclasses.replace(s, key_slots=s.key_slots.to(device), mask=None if s.mask is None else s.mask.to(device))
            for s in self.sequences
        )
        return ForwardInputs(
            self.input_ids.to(device),
            self.positions.to(device),
            self.slot_mapping.to(device),
            sequences,
            self.offload,
            self.state,
        )


class ModelExecutor:
    """One rank's model part and the state a forward needs. `k_caches` / `v_caches`: per layer
    [num_pages * page_size, Hkv / tensor_parallel_size, D]. `runtime` is this rank's view of the parallel run (its
    group and the step channel; on rank 0 also the worker processes)."""

    def __init__(
        self,
        model: DiffusionModel,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        offload: ExpertOffload | None,
        page_size: int,
        device: torch.device,
        runtime: ParallelRuntime | None = None,
        state_cache: StateCache | None = None,
    ) -> None:
        self.model, self.offload = model, offload
        self.state_cache = state_cache
        self.k_caches, self.v_caches = k_caches, v_caches
        self.num_pages, self.page_size = k_caches[0].shape[0] // page_size, page_size
        self.device = device
        self.runtime = runtime or ParallelRuntime()
        self._failure: str | None = None
        self.run_model = CompiledForward(model, False, device)
        """The forward a step calls: `model`, or its compiled form (see `build`)."""

    @classmethod
    def build(
        cls, config: EngineConfig, args: ModelArgs, max_model_len: int, runtime: ParallelRuntime, device: torch.device
    ) -> ModelExecutor:
        """This rank's model part (experts in host memory under offload), expert cache and KV cache. Every rank calls
        it; the ranks agree on the smallest page count, since rank 0 hands out pages for all of them."""
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
        page_size = resolve_page_size(config.cache.page_size, args.block_length)
        sched = config.scheduler
        dtype = next(model.parameters()).dtype
        state_cache = None
        if has_recurrent_state(args) and config.cache.recurrent_state != "recompute":
            # Allocated before the KV cache: on a GPU the K/V pages take what is left.
            state_spec = StateCacheSpec(args, dtype)
            num_slots = num_slots_for(config.cache, state_spec, sched.max_num_seqs)
            state_cache = StateCache.allocate(state_spec, num_slots, device)
        spec = spec_for(args, page_size, dtype, group.size)
        reserve = sched.max_num_batched_tokens * (args.hidden_size * 32 + args.vocab_size * 4)
        num_pages = num_pages_for(config.cache, spec, device, sched.max_num_seqs, max_model_len, reserve)
        k_caches, v_caches = allocate_kv_cache(spec, agree_min(group, num_pages), device)
        set_moe_backend(model, config.moe_backend)
        set_gdn_backend(model, config.gdn_backend, device)
        executor = cls(model, k_caches, v_caches, experts, page_size, device, runtime, state_cache)
        compiled = should_compile(config.enforce_eager, device) and not offload  # offload's hooks stay eager
        executor.run_model = CompiledForward(model, compiled, device)
        return executor

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

    def forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """This rank's forward -> hidden states [N, H] (the same on every rank after the last all-reduce)."""
        attention = PagedAttentionInputs(inputs.slot_mapping, inputs.sequences, self.k_caches, self.v_caches)
        if inputs.state is not None:
            return self._forward_hybrid(inputs, attention, inputs.state)
        if inputs.offload is None:
            return self.run_model(inputs.input_ids, inputs.positions, attention)
        with offload_context(inputs.offload):
            return self.model(inputs.input_ids, inputs.positions, attention)

    def _forward_hybrid(self, inputs: ForwardInputs, attention: PagedAttentionInputs, plan: StatePlan) -> torch.Tensor:
        """A hybrid model's step: slots restored or reset, the forward (the GDN layers advance the slots), then
        each committing sequence's last hidden row kept in its slot."""
        cache = self.state_cache
        assert cache is not None, "a state plan for a model without recurrent state"
        if plan.restore is not None:
            cache.copy(*plan.restore)
        if plan.reset.numel():
            cache.reset(plan.reset)
        recurrent = RecurrentStepInputs(
            cache.conv_caches, cache.recurrent_caches, plan.commits, plan.blocks, plan.preview, plan.rescan
        )
        if inputs.offload is None:
            hidden = self.model(inputs.input_ids, inputs.positions, attention, recurrent)
        else:
            with offload_context(inputs.offload):
                hidden = self.model(inputs.input_ids, inputs.positions, attention, recurrent)
        if plan.last_rows.numel():
            cache.last_hidden.index_copy_(0, plan.last_slots, hidden[plan.last_rows])
        return hidden

    def loop(self) -> None:
        """Worker ranks: runs every forward rank 0 sends until it sends None (stop)."""
        assert self.runtime.channel is not None and self.runtime.group.rank > 0, "loop() is for worker ranks"
        with torch.inference_mode():
            while (inputs := self.runtime.channel.receive()) is not None:
                self.forward(inputs.to(self.device))

    def close(self) -> None:
        """Rank 0: stops the worker ranks, if any (idempotent)."""
        self.runtime.close()
