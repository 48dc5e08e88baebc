"""Builds an engine's parts from an EngineConfig: resolves the model-dependent settings (device, block length,
max_model_len), starts the parallel ranks if any, builds rank 0's executor (model part, KV cache, expert offload),
the scheduler, the model runner and the tokenizer.

Worker ranks run `serve_worker_rank`: the same executor, built the same way, serving rank 0's forwards. Rank 0
hands it to the processes it spawns; under torchrun, ranks > 0 reach it through `run_if_torchrun_worker`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from diffuserve.config import EngineConfig
from diffuserve.distributed.group import ParallelGroup, launched_by_torchrun, rank_device, torchrun_rank
from diffuserve.distributed.launcher import ParallelRuntime, start_parallel
from diffuserve.distributed.step_channel import StepChannel
from diffuserve.distributed.worker import run_torchrun_worker
from diffuserve.engine.executor import ModelExecutor
from diffuserve.engine.hybrid_runner import HybridRunner
from diffuserve.engine.kv_pages import PagePool
from diffuserve.engine.model_runner import ModelRunner
from diffuserve.engine.recompute_runner import RecomputeRunner, check_recompute_config
from diffuserve.engine.rescan_runner import RescanRunner
from diffuserve.engine.scheduler import Scheduler
from diffuserve.engine.state_scheduling import StateSlots
from diffuserve.engine.state_slots import StatePool
from diffuserve.model.config import ModelArgs
from diffuserve.model.loader import load_args, read_model_config
from diffuserve.model.registry import ModelFamily
from diffuserve.model.tensor_parallel import check_parallel_sizes
from diffuserve.tokenizer import Tokenizer

DEFAULT_MAX_MODEL_LEN = 32768
GENERATION_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "decoder",
    "threshold",
    "steps",
    "entropy_bound",
    "edit_threshold",
    "max_post_edit_steps",
)


@dataclass(frozen=True)
class EngineComponents:
    args: ModelArgs
    tokenizer: Tokenizer | None
    runner: ModelRunner
    scheduler: Scheduler
    pool: PagePool
    state_pool: StatePool | None
    """Hybrid models: the recurrent-state slots (None for models without GDN layers)."""
    max_model_len: int
    generation_defaults: dict[str, Any]
    steps_capped_by_max_tokens: bool
    """The family's reference caps denoising steps at max_tokens (ModelFamily)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available; use --device cpu")
    return torch.device(name)


def resolve_max_model_len(requested: int | None, args: ModelArgs) -> int:
    if requested is None:
        return min(args.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    limit = args.max_position_embeddings
    if requested > limit and args.rope.rope_type == "default":
        raise ValueError(
            f"max_model_len: {requested} exceeds the model's max_position_embeddings {limit} and its RoPE has no "
            "scaling; lower --max-model-len"
        )
    return requested


def load_model_args(config: EngineConfig) -> tuple[ModelFamily, ModelArgs, int]:
    """(family, args with the configured block length, max_model_len): what every rank derives alike."""
    family, args = load_args(config.model)
    args = args.replace(block_length=config.block_length or args.block_length)
    return family, args, resolve_max_model_len(config.max_model_len, args)


def build_components(config: EngineConfig) -> EngineComponents:
    family, args, max_model_len = load_model_args(config)
    if family.has_recurrent_state:
        check_recompute_config(config)
    sched = config.scheduler
    if sched.max_num_batched_tokens < args.block_length:
        raise ValueError(
            f"max_num_batched_tokens: {sched.max_num_batched_tokens} is below the block length {args.block_length}; "
            f"raise it to at least {2 * args.block_length}"
        )
    executor = _build_executor(config, args, max_model_len)
    recompute = family.has_recurrent_state and config.cache.recurrent_state == "recompute"
    # Recompute keeps nothing between steps, so no page may be reused from the prefix cache either.
    pool = PagePool(executor.num_pages, executor.page_size, config.cache.enable_prefix_caching and not recompute)
    state_pool, state = _state_slots(config, executor) if family.has_recurrent_state and not recompute else (None, None)
    scheduler = Scheduler(
        pool, sched.max_num_seqs, sched.max_num_batched_tokens, args.block_length, sched.fused_commit, state
    )
    runner = _runner(config, executor, family.has_recurrent_state, args.block_length, max_model_len)
    _, generation = read_model_config(config.model)
    from_file = {k: generation[k] for k in GENERATION_KEYS if generation.get(k) is not None}
    defaults = {**family.decoding_defaults, **from_file}
    return EngineComponents(
        args,
        _tokenizer(config.model),
        runner,
        scheduler,
        pool,
        state_pool,
        max_model_len,
        defaults,
        family.steps_capped_by_max_tokens,
    )


def _runner(
    config: EngineConfig, executor: ModelExecutor, hybrid: bool, block_length: int, max_model_len: int
) -> ModelRunner:
    """The model runner of the family and, for hybrid models, of --recurrent-state."""
    mode = config.cache.recurrent_state if hybrid else None
    stats = bool(config.expert_stats)
    if mode == "rescan":  # the history covers the last block, which may reach past max_model_len
        return RescanRunner(executor, block_length, max_model_len + block_length, config.seed, stats)
    runner_cls = {None: ModelRunner, "keep": HybridRunner, "recompute": RecomputeRunner}[mode]
    return runner_cls(executor, block_length, config.seed, stats)


def _state_slots(config: EngineConfig, executor: ModelExecutor) -> tuple[StatePool, StateSlots]:
    """The slot pool over the executor's state cache (slot_bytes: what one slot holds in the cache)."""
    cache = executor.state_cache
    assert cache is not None, "a model with recurrent state gets a state cache"
    slot_bytes = cache.state_bytes_per_slot() + cache.last_hidden[0].numel() * cache.last_hidden.element_size()
    # A rescan snapshot would need the prefix's kept projections too: the baseline takes none (rescan_runner).
    snapshots = config.cache.enable_prefix_caching and config.cache.recurrent_state == "keep"
    pool = StatePool(cache.num_slots, slot_bytes, snapshots)
    return pool, StateSlots(pool, executor.page_size, config.cache.state_snapshot_interval)


def serve_worker_rank(config: EngineConfig, group: ParallelGroup, device: torch.device) -> None:
    """A worker rank's whole run once it joined the group: builds its executor the way rank 0 builds its own,
    then serves rank 0's forwards until told to stop."""
    worker_executor(config, group, device).loop()


def worker_executor(config: EngineConfig, group: ParallelGroup, device: torch.device) -> ModelExecutor:
    _, args, max_model_len = load_model_args(config)
    return ModelExecutor.build(config, args, max_model_len, ParallelRuntime(group, StepChannel(group)), device)


def run_if_torchrun_worker(config: EngineConfig) -> bool:
    """Under torchrun, a rank >= 1 serves rank 0's forwards until told to stop and returns True; rank 0 (and a
    process torchrun did not start) returns False at once and goes on to build the engine."""
    if not launched_by_torchrun() or torchrun_rank()[0] == 0:
        return False
    _check_torchrun_size(config.parallel.tensor_parallel_size)
    run_torchrun_worker(
        partial(serve_worker_rank, config), config.parallel.enable_expert_parallel, resolve_device(config.device).type
    )
    return True


def _build_executor(config: EngineConfig, args: ModelArgs, max_model_len: int) -> ModelExecutor:
    """Rank 0's executor, after starting (or joining) the other ranks, which build theirs alike."""
    parallel = config.parallel
    device = resolve_device(config.device)
    if parallel.tensor_parallel_size > 1:
        check_parallel_sizes(args, parallel.tensor_parallel_size, parallel.enable_expert_parallel)
        if launched_by_torchrun():
            _check_torchrun_rank_0(parallel.tensor_parallel_size)
        device = rank_device(device.type, 0)
    target = partial(serve_worker_rank, config)
    runtime = start_parallel(parallel.tensor_parallel_size, parallel.enable_expert_parallel, device, target)
    try:
        return ModelExecutor.build(config, args, max_model_len, runtime, device)
    except BaseException as e:
        error = runtime.failure()
        runtime.close()
        if error is not None:
            raise RuntimeError(error) from e
        raise


def _check_torchrun_rank_0(size: int) -> None:
    if torchrun_rank()[0] != 0:
        raise ValueError(
            "torchrun rank > 0: call diffuserve.engine.engine_setup.run_if_torchrun_worker(config) "
            "before building an engine (`diffuserve serve` does)"
        )
    _check_torchrun_size(size)


def _check_torchrun_size(size: int) -> None:
    world = torchrun_rank()[1]
    if world != size:
        raise ValueError(
            f"tensor_parallel_size: {size} differs from torchrun's {world} processes; "
            f"pass --tensor-parallel-size {world}"
        )


def _tokenizer(model_dir: str) -> Tokenizer | None:
    files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    return Tokenizer(model_dir) if any((Path(model_dir) / f).is_file() for f in files) else None
