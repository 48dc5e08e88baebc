"""Builds an engine's parts from an EngineConfig: resolves the model-dependent settings (device, block length,
max_model_len), starts the parallel ranks if any, builds rank 0's executor (model part, KV cache, expert offload),
the scheduler, the model runner and the tokenizer.

Worker ranks run `serve_worker_rank`: the same executor, built the same way, serving rank 0's forwards. Rank 0
hands it to the processes it spawns; under torchrun, ranks > 0 reach it through `run_if_torchrun_worker`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from diffuserve.config import EngineConfig, SchedulerConfig
from diffuserve.core.cache.manager import CacheManager
from diffuserve.core.draft_switch import default_draft_cost, default_draft_tokens
from diffuserve.core.scheduler import Scheduler
from diffuserve.core.step_budget import default_prefill_tokens
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.distributed.group import ParallelGroup, launched_by_torchrun, rank_device, torchrun_rank
from diffuserve.distributed.launcher import ParallelRuntime, start_parallel
from diffuserve.distributed.step_channel import StepChannel
from diffuserve.distributed.worker import run_torchrun_worker
from diffuserve.engine.gc_heap import freeze_heap
from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.loader import load_args, read_model_config
from diffuserve.model.tensor_parallel import check_parallel_sizes
from diffuserve.sampling_defaults import PENALTY_DEFAULTS
from diffuserve.text.tokenizer import Tokenizer
from diffuserve.worker.executor import ModelExecutor
from diffuserve.worker.model_runner import ModelRunner

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
"""generation_config.json keys read as request defaults under their own names (unless the family reads its file
itself: ModelFamily.generation_defaults)."""


@dataclass(frozen=True)
class EngineComponents:
    args: ModelArgs
    tokenizer: Tokenizer | None
    runner: ModelRunner
    decoding: BlockDecoding
    """The decoding the runner calls each step; the engine resolves each request's decoder with it."""
    scheduler: Scheduler
    cache: CacheManager
    max_model_len: int
    generation_defaults: dict[str, Any]


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
    family, args = load_args(config.model, config.strict_config)
    args = args.replace(block_length=config.block_length or args.block_length)
    return family, args, resolve_max_model_len(config.max_model_len, args)


RunnerFactory = Callable[[ModelExecutor, BlockDecoding, int], ModelRunner]
"""(executor, block decoding, max_model_len) -> the model runner (a benchmark baseline's, bench/baselines)."""


def serving_runner(config: EngineConfig) -> RunnerFactory:
    return lambda executor, decoding, max_model_len: ModelRunner(executor, decoding, bool(config.expert_stats))


def generation_defaults(family: ModelFamily, generation: dict) -> dict[str, Any]:
    """The request defaults a model directory's generation_config.json gives, over the family's own."""
    if family.generation_defaults is not None:
        from_file = family.generation_defaults(generation)
    else:
        from_file = {k: generation[k] for k in GENERATION_KEYS if generation.get(k) is not None}
    penalties = {k: generation[k] for k in PENALTY_DEFAULTS if generation.get(k) is not None}  # every family's
    return {**family.decoding_defaults, **from_file, **penalties}


def _check_step_budgets(sched: SchedulerConfig, block_length: int) -> None:
    """A step's budgets must each hold one block, or a request could never be prefilled or decoded."""
    if sched.max_num_batched_tokens < block_length:
        raise ValueError(
            f"max_num_batched_tokens: {sched.max_num_batched_tokens} is below the block length {block_length}; "
            f"raise it to at least {2 * block_length}"
        )
    if sched.max_prefill_tokens is not None and sched.max_prefill_tokens < block_length:
        raise ValueError(
            f"max_prefill_tokens: {sched.max_prefill_tokens} is below the block length {block_length} (prefill "
            f"runs in whole blocks); raise it to at least {block_length}"
        )


def _scheduler(sched: SchedulerConfig, cache: CacheManager, executor: ModelExecutor, block_length: int) -> Scheduler:
    """The scheduler, its device-dependent defaults resolved (core/scheduler.py, core/draft_switch.py)."""
    device = executor.device.type
    # A one-token block of a model predicting position p from row p - 1 is read from the last committed row alone.
    headless = executor.model.step_rules.prediction_shift and block_length == 1
    draft_tokens = sched.auto_draft_tokens
    prefill_tokens = sched.max_prefill_tokens
    return Scheduler(
        cache,
        sched.max_num_seqs,
        sched.max_num_batched_tokens,
        block_length,
        sched.fused_commit,
        not headless,
        default_draft_tokens(device, block_length) if draft_tokens is None else draft_tokens,
        default_prefill_tokens(device, sched.max_num_batched_tokens, block_length)
        if prefill_tokens is None
        else prefill_tokens,
        default_draft_cost(device),
    )


def build_components(config: EngineConfig, make_runner: RunnerFactory | None = None) -> EngineComponents:
    family, args, max_model_len = load_model_args(config)
    sched = config.scheduler
    _check_step_budgets(sched, args.block_length)
    executor = _build_executor(config, args, max_model_len)
    cache = CacheManager.build(executor.sizes, config.cache, sched.max_num_batched_tokens)
    scheduler = _scheduler(sched, cache, executor, args.block_length)
    tokenizer = _tokenizer(config.model)
    structured = (
        StructuredDecoding(tokenizer, args.vocab_size, list(args.eos_token_ids)) if tokenizer is not None else None
    )
    decoding = BlockDecoding(
        executor.model.step_rules, args.block_length, executor.device, config.seed, structured, args.vocab_size
    )
    runner = (make_runner or serving_runner(config))(executor, decoding, max_model_len)
    defaults = generation_defaults(family, read_model_config(config.model)[1])
    if config.default_decoder is not None:
        defaults = {**defaults, "decoder": config.default_decoder}
    return EngineComponents(args, tokenizer, runner, decoding, scheduler, cache, max_model_len, defaults)


def serve_worker_rank(config: EngineConfig, group: ParallelGroup, device: torch.device) -> None:
    """A worker rank's whole run once it joined the group: builds its executor the way rank 0 builds its own,
    then serves rank 0's forwards until told to stop (its heap frozen for the GC then: engine/gc_heap.py)."""
    executor = worker_executor(config, group, device)
    freeze_heap(f"worker rank {group.rank}")
    executor.loop()


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
