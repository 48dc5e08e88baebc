"""Engines running a benchmark baseline runner instead of the serving one (models with recurrent layers only):

    recompute   no cache read: each step recomputes every request's committed prefix (recompute.py)
    rescan      K/V cached, GDN state rebuilt every step from the prefix's kept projections (rescan.py)

Both run without prefix caching (neither keeps what a prefix hit would restore). `bench compare` builds its
recompute-state and gdn-rescan variants here; the tests use them as slow, independent paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from diffuserve.bench.baselines.recompute import RecomputeRunner
from diffuserve.bench.baselines.rescan import RescanRunner
from diffuserve.config import EngineConfig
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.llm import LLM
from diffuserve.model.hub import resolve_model
from diffuserve.worker.executor import ModelExecutor
from diffuserve.worker.model_runner import ModelRunner

BASELINES = ("recompute", "rescan")


def baseline_engine(config: EngineConfig, baseline: str) -> LLMEngine:
    """An engine of `config` whose runner is the `baseline` (one of BASELINES)."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline: {baseline!r} is not one of {', '.join(BASELINES)}")
    if config.cache.expert_offload:
        raise ValueError(
            f"expert_offload: not supported by the {baseline} baseline (models with recurrent layers, clover_moe); "
            "drop --expert-offload"
        )
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache, enable_prefix_caching=False))

    def make_runner(executor: ModelExecutor, decoding: BlockDecoding, max_model_len: int) -> ModelRunner:
        stats = bool(config.expert_stats)
        if executor.caches.state is None:
            raise ValueError(f"baseline: {baseline} is for models with recurrent layers (clover_moe)")
        if baseline == "recompute":
            return RecomputeRunner(executor, decoding, stats)
        # the history covers the last block, which may reach past max_model_len
        return RescanRunner(executor, decoding, max_model_len + decoding.block_length, stats)

    return LLMEngine(config, make_runner)


def baseline_llm(model: str, baseline: str, **kwargs: Any) -> LLM:
    """`LLM(model, **kwargs)` on the `baseline` runner."""
    return LLM.from_engine(baseline_engine(EngineConfig.from_kwargs(resolve_model(str(model)), **kwargs), baseline))
