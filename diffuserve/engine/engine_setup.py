"""Builds an engine's parts from an EngineConfig: resolves the model-dependent settings (device, block length,
max_model_len, page size, KV budget), starts the parallel ranks if any, loads this rank's part of the model and
the tokenizer, sets up expert offload and allocates the KV cache. Worker ranks build their part with the same
`build_shard`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diffuserve.config import EngineConfig
from diffuserve.distributed.group import ParallelGroup, agree_min
from diffuserve.distributed.launcher import start_parallel
from diffuserve.distributed.worker import worker_device
from diffuserve.engine.expert_offload import ExpertOffload
from diffuserve.engine.forward_step import ModelShard
from diffuserve.engine.kv_cache import allocate_kv_cache, num_pages_for, resolve_page_size, spec_for
from diffuserve.engine.kv_pages import PagePool
from diffuserve.engine.model_runner import ModelRunner
from diffuserve.engine.recompute_runner import RecomputeRunner, check_recompute_config
from diffuserve.engine.scheduler import Scheduler
from diffuserve.model.config import ModelArgs
from diffuserve.model.loader import load_args, load_model, read_model_config
from diffuserve.model.registry import ModelFamily
from diffuserve.model.tensor_parallel import check_parallel_sizes
from diffuserve.tokenizer import Tokenizer

DEFAULT_MAX_MODEL_LEN = 32768
GENERATION_KEYS = ("temperature", "top_p", "top_k", "decoder", "threshold", "steps", "entropy_bound",
                   "edit_threshold", "max_post_edit_steps")


@dataclass(frozen=True)
class EngineComponents:
    args: ModelArgs
    tokenizer: Tokenizer | None
    runner: ModelRunner
    scheduler: Scheduler
    pool: PagePool
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


def resolve_model(config: EngineConfig) -> tuple[ModelFamily, ModelArgs, int]:
    """(family, args with the configured block length, max_model_len): what every rank derives alike."""
    family, args = load_args(config.model)
    args = args.replace(block_length=config.block_length or args.block_length)
    return family, args, resolve_max_model_len(config.max_model_len, args)


def build_shard(config: EngineConfig, args: ModelArgs, max_model_len: int, group: ParallelGroup,
                device: torch.device) -> ModelShard:
    """This rank's model part (experts in host memory under offload), expert cache and KV cache. Every rank calls
    it; the ranks agree on the smallest page count, since rank 0 hands out pages for all of them."""
    offload = config.cache.expert_offload
    # The RoPE table covers the last block, which may reach past max_model_len.
    args, model = load_model(config.model, config.dtype, str(device), max_model_len + args.block_length, args,
                             group, torch.device("cpu") if offload else None, config.load_format, config.seed)
    experts = ExpertOffload(model, device, config.cache.expert_cache_memory, config.cache.expert_residency) \
        if offload else None
    page_size = resolve_page_size(config.cache.page_size, args.block_length)
    sched = config.scheduler
    spec = spec_for(args, page_size, next(model.parameters()).dtype, group.size)
    reserve = sched.max_num_batched_tokens * (args.hidden_size * 32 + args.vocab_size * 4)
    num_pages = num_pages_for(config.cache, spec, device, sched.max_num_seqs, max_model_len, reserve)
    num_pages = agree_min(group, num_pages)
    k_caches, v_caches = allocate_kv_cache(spec, num_pages, device)
    return ModelShard(model, k_caches, v_caches, experts, num_pages, page_size)


def build_components(config: EngineConfig) -> EngineComponents:
    family, args, max_model_len = resolve_model(config)
    if family.has_recurrent_state:
        check_recompute_config(config)
    sched = config.scheduler
    if sched.max_num_batched_tokens < args.block_length:
        raise ValueError(
            f"max_num_batched_tokens: {sched.max_num_batched_tokens} is below the block length {args.block_length}; "
            f"raise it to at least {2 * args.block_length}"
        )
    parallel = config.parallel
    device = resolve_device(config.device)
    if parallel.tensor_parallel_size > 1:
        check_parallel_sizes(args, parallel.tensor_parallel_size, parallel.enable_expert_parallel)
        device = worker_device(config, 0)
    runtime = start_parallel(config, device)
    try:
        shard = build_shard(config, args, max_model_len, runtime.group, device)
    except BaseException as e:
        error = runtime.worker_error()
        runtime.close()
        if error is not None:
            raise RuntimeError(error) from e
        raise
    pool = PagePool(shard.num_pages, shard.page_size, config.cache.enable_prefix_caching)
    scheduler = Scheduler(pool, sched.max_num_seqs, sched.max_num_batched_tokens, args.block_length, sched.fused_commit)
    runner_cls = RecomputeRunner if family.has_recurrent_state else ModelRunner
    runner = runner_cls(shard, args.block_length, device, config.seed, runtime)
    _, generation = read_model_config(config.model)
    from_file = {k: generation[k] for k in GENERATION_KEYS if generation.get(k) is not None}
    defaults = {**family.decoding_defaults, **from_file}
    return EngineComponents(args, _tokenizer(config.model), runner, scheduler, pool, max_model_len, defaults)


def _tokenizer(model_dir: str) -> Tokenizer | None:
    from pathlib import Path

    files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    return Tokenizer(model_dir) if any((Path(model_dir) / f).is_file() for f in files) else None
