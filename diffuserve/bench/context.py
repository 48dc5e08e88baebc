"""What every offline benchmark sets up before measuring: threads, the model directory and its shape, the
resolved dtype and device, this machine's measured rates, the environment block, and fresh engines.

A fresh engine is built for every measured configuration, so its counters (steps, expert statistics) cover
exactly that run; one throw-away warm-up run per process pays for first-call costs (allocator, thread pools,
kernel selection) before anything is timed. Knows nothing of what a subcommand reports.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffuserve.bench.baselines.engines import baseline_engine
from diffuserve.bench.environment import environment, load_average
from diffuserve.bench.flops import ModelCost, model_cost
from diffuserve.bench.probes import MachineRates, measure_machine
from diffuserve.bench.workload import BenchModel, prepare_model, random_prompts
from diffuserve.config import EngineConfig
from diffuserve.engine.engine_setup import generation_defaults, resolve_device
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.config import ModelArgs
from diffuserve.model.loader import load_args, read_model_config, resolve_dtype
from diffuserve.model.quant.scheme import DEFAULT_TARGETS
from diffuserve.sampling_params import SamplingParams
from diffuserve.worker.cache.allocation import resolve_page_size


@dataclass(frozen=True)
class BenchContext:
    model_dir: Path
    model_info: dict[str, Any]
    model_config: dict[str, Any]
    args: ModelArgs
    dtype: str
    device: torch.device
    cost: ModelCost
    rates: MachineRates
    environment: dict[str, Any]
    seed: int
    generation_defaults: dict[str, Any]
    """The model's generation_config.json decoding knobs (what a request that sets none gets)."""
    probe_seconds: float
    engine_options: dict[str, Any]
    """--moe-backend, --attention-backend, --kv-cache-dtype, --enforce-eager and --quantization, given to every engine
    unless a variant overrides them."""

    def engine(
        self, block_length: int, max_num_seqs: int, max_model_len: int, baseline: str | None = None, **options: Any
    ) -> LLMEngine:
        """A fresh engine on the benchmark model, its KV cache holding max_num_seqs whole sequences of
        max_model_len (so no run is ever preempted: preemption is not what these benchmarks measure);
        `baseline`: one of bench/baselines' runners instead of the serving one."""
        page_size = resolve_page_size(None, block_length)
        num_pages = max_num_seqs * -(-(max_model_len + block_length) // page_size)
        config = EngineConfig.from_kwargs(
            str(self.model_dir),
            dtype=self.dtype,
            device=str(self.device),
            block_length=block_length,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            seed=self.seed,
            num_pages=num_pages,
            page_size=page_size,
            **({"expert_stats": True} | self.engine_options | options),
        )
        return LLMEngine(config) if baseline is None else baseline_engine(config, baseline)

    def measure_rates(self) -> MachineRates:
        """The probes again (run right before and after each measured run, so that its efficiency is taken
        against the machine as it was then: on a shared machine the rates move with other processes' load)."""
        return measure_machine(self.device, getattr(torch, self.dtype), seconds=self.probe_seconds)

    def run_record(self, bench: str) -> dict[str, Any]:
        """The fields every bench's JSON opens with: the bench, the environment (with the load at the end), the
        model, the dtype and the machine's measured rates."""
        return {
            "bench": bench,
            "environment": {**self.environment, "load_average_end": load_average()},
            "model": self.model_info,
            "dtype": self.dtype,
            "machine": self.rates.to_json(),
        }

    def prompts(self, num_prompts: int, num_tokens: int) -> list[list[int]]:
        special = {self.args.mask_token_id, *self.args.eos_token_ids}
        if self.args.pad_token_id is not None:
            special.add(self.args.pad_token_id)
        return random_prompts(num_prompts, num_tokens, self.args.vocab_size, self.seed, frozenset(special))


def make_context(ns: argparse.Namespace) -> BenchContext:
    """Applies --threads, prepares the model, measures the machine (matmul rate, bandwidth)."""
    if ns.threads:
        torch.set_num_threads(ns.threads)
    spec = BenchModel(seed=ns.model_seed, logit_scale=ns.logit_scale)
    model_dir = prepare_model(ns.model, ns.model_cache_dir, spec)
    config, generation = read_model_config(model_dir)
    family, args = load_args(model_dir)
    dtype = resolve_dtype(ns.dtype, args)
    device = resolve_device(ns.device)
    itemsize = torch.finfo(dtype).bits // 8
    info = {
        "path": str(model_dir),
        "name": "sdar-moe-bench (random weights)" if ns.model is None else model_dir.name,
        "random_weights": None
        if ns.model
        else {"seed": spec.seed, "init_std": spec.init_std, "logit_scale": spec.logit_scale},
    }
    return BenchContext(
        model_dir=model_dir,
        model_info=info,
        model_config=config,
        args=args,
        dtype=str(dtype).removeprefix("torch."),
        device=device,
        cost=model_cost(args, itemsize, 1 if getattr(ns, "kv_cache_dtype", "auto") == "fp8" else itemsize),
        rates=measure_machine(device, dtype, seconds=ns.probe_seconds),
        environment=environment(device),
        seed=ns.seed,
        generation_defaults=generation_defaults(family, generation),
        probe_seconds=ns.probe_seconds,
        engine_options={
            "moe_backend": getattr(ns, "moe_backend", "auto"),
            "block_expert_coreset": getattr(ns, "block_expert_coreset", None),
            "attention_backend": getattr(ns, "attention_backend", "auto"),
            "kv_cache_dtype": getattr(ns, "kv_cache_dtype", "auto"),
            "enforce_eager": getattr(ns, "enforce_eager", None),
            "tensor_parallel_size": getattr(ns, "tensor_parallel_size", 1),
            "enable_expert_parallel": getattr(ns, "enable_expert_parallel", False),
            **quantization_options(ns, single=getattr(ns, "bench_command", None) != "latency"),
        },
    )


def quantization_options(ns: argparse.Namespace, single: bool, method: str | None = None) -> dict[str, Any]:
    """The engine's --quantization options of a run (`method`: one of several, else the only one given)."""
    methods = getattr(ns, "quantization", ["none"])
    if method is None:
        if single and len(methods) > 1:
            raise ValueError(
                f"quantization: this benchmark runs one, got {' '.join(methods)}; `bench latency` takes several"
            )
        method = methods[0]
    return {
        "quantization": None if method == "none" else method,
        "quantization_targets": getattr(ns, "quantization_targets", DEFAULT_TARGETS),
        "quantization_group_size": getattr(ns, "quantization_group_size", 128),
    }


def sampling_params(ns: argparse.Namespace, output_tokens: int) -> SamplingParams:
    """Fixed-length outputs (EOS ignored, as every throughput benchmark must, or lengths would differ by run)."""
    return SamplingParams(
        max_tokens=output_tokens,
        ignore_eos=True,
        temperature=ns.temperature,
        seed=ns.seed,
        decoder=ns.decoder,
        threshold=ns.threshold,
    )


def decoding(ctx: BenchContext, params: SamplingParams) -> dict[str, Any]:
    """The decoding a request with `params` actually gets (model defaults filled in), for the JSON."""
    resolved = params.with_defaults(ctx.generation_defaults)
    return {
        "decoder": resolved.decoder,
        "threshold": resolved.threshold,
        "steps": resolved.steps,
        "entropy_bound": resolved.entropy_bound,
        "temperature": resolved.temperature,
        "seed": resolved.seed,
    }


def warm_up(ctx: BenchContext, block_length: int, prompt_tokens: int, params: SamplingParams) -> int:
    """One short throw-away run (two prompts, two blocks of output). Returns the model's parameter count."""
    max_len = prompt_tokens + 3 * block_length
    engine = ctx.engine(block_length, 2, max_len)
    short = params.replace(max_tokens=min(params.max_tokens or block_length, 2 * block_length))
    for i, prompt in enumerate(ctx.prompts(2, prompt_tokens)):
        engine.add_request(f"warm-up-{i}", prompt, short)
    while engine.has_unfinished_requests():
        engine.step()
    num_params = sum(p.numel() for p in engine.runner.model.parameters())
    engine.shutdown()  # a multi-process engine's workers
    return num_params


def max_model_len(prompt_tokens: int, output_tokens: int, block_length: int) -> int:
    """Room for the prompt, the output and the last block's padding past it."""
    return prompt_tokens + output_tokens + block_length
