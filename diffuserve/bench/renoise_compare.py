"""`diffuserve bench compare` for a model whose blocks are renoise canvases (DiffusionGemma; the model's
generation defaults name the renoise decoder): the engine against transformers' own `generate`, one run:

  engine                 diffuserve, each prompt alone (1 request)
  engine-batched         diffuserve given all --num-prompts prompts at once (N concurrent)
  transformers           transformers' DiffusionGemmaForBlockDiffusion.generate, each prompt alone, its global
                         generator seeded with the request's seed (as a user calls it)
  transformers-batched   transformers' generate given all prompts as one batch [N, P] (its fastest use for N
                         concurrent requests: one decoder forward of N canvases per step, until all stop)

engine and engine-batched draw the same random numbers (the counter-based draws of decoding/renoise_draws, keyed
by each request's seed, canvas start, step and position, whatever the batch), so their tokens must be identical:
the run reports it. transformers draws from torch's global generator in its own order, so at a temperature above
0 its tokens are other samples of the same model: the run reports the share of positions that agree, and its
ratios compare speed only. Token for token equality with transformers' `generate` drawing by the engine's rule
(reference_counter_draws) is what tests/engine/test_diffusion_gemma_engine.py asserts.
Denoising steps: --denoising-steps, else the model's max_denoising_steps. EOS is ignored on both sides
(transformers runs with an EOS id no token has), so every request generates --output-tokens. Knows nothing of CLI
parsing.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from diffuserve.bench.context import BenchContext, decoding, max_model_len
from diffuserve.bench.engine_run import run_requests
from diffuserve.bench.environment import peak_memory_bytes
from diffuserve.bench.report import finish, format_table, variant_record
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.sampling_params import SamplingParams

VARIANTS = ("engine", "engine-batched", "transformers", "transformers-batched")
SAME_TOKENS = ("engine", "engine-batched")
TARGETS = (("engine", "transformers", 3.0), ("engine-batched", "transformers-batched", 8.0))
"""(variant, slower variant, minimum speed-up): the targets against transformers (1 request; N = 16 concurrent)."""


def renoise_params(ns: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=ns.output_tokens, ignore_eos=True, seed=ns.seed, steps=ns.denoising_steps)


@dataclass
class EngineVariant:
    engine: LLMEngine
    sequential: bool
    walls: list[float] = field(default_factory=list)
    tokens: list[list[int]] | None = None
    nfe: int = 0

    def measure(self, prompts: list[list[int]], params: SamplingParams) -> None:
        record = run_requests(self.engine, prompts, params, sequential=self.sequential)
        self.tokens, self.nfe = [o.outputs[0].token_ids for o in record.outputs], record.num_forwards
        self.walls.append(record.wall_s)

    def result(self) -> dict[str, Any]:
        assert self.tokens is not None, "measure() first"
        return variant_record(self.tokens, self.nfe, self.walls)


def engine_variant(ctx: BenchContext, ns: argparse.Namespace, params: SamplingParams, batched: bool) -> EngineVariant:
    """A fresh engine (no prefix cache), warmed up by one short request on a prompt that is not measured."""
    block = ctx.args.block_length
    length = max_model_len(ns.prompt_tokens, ns.output_tokens, block)
    engine = ctx.engine(block, ns.num_prompts if batched else 1, length, enable_prefix_caching=False)
    warm = ctx.prompts(ns.num_prompts + 1, ns.prompt_tokens)[-1]
    run_requests(engine, [warm], params.replace(max_tokens=1, steps=2))
    return EngineVariant(engine, sequential=not batched)


class TransformersGenerate:
    """transformers' model from the benchmark directory, generating the way a user calls it."""

    def __init__(self, ctx: BenchContext, params: SamplingParams) -> None:
        from diffuserve.reference.diffusion_gemma_hf import load_hf_model

        self.model = load_hf_model(ctx.model_dir, getattr(torch, ctx.dtype)).to(ctx.device)
        config = copy.deepcopy(self.model.generation_config)
        # ignore_eos, as the engine's requests: an id no token has (None would fall back to the model's own)
        config.eos_token_id = [ctx.args.vocab_size]
        resolved = params.with_defaults(ctx.generation_defaults)
        config.max_denoising_steps = resolved.steps
        self.config, self.max_tokens, self.seed, self.device = config, params.max_tokens or 1, resolved.seed, ctx.device

    def generate(self, prompts: list[list[int]]) -> list[list[int]]:
        """One generate call for `prompts` (equal lengths) -> each one's first max_tokens generated tokens."""
        torch.manual_seed(self.seed or 0)
        ids = torch.tensor(prompts, device=self.device)
        with torch.inference_mode():
            out = self.model.generate(ids, generation_config=self.config, max_new_tokens=self.max_tokens)
        sequences = out.sequences if hasattr(out, "sequences") else out
        return [row[len(prompts[0]) :][: self.max_tokens].tolist() for row in sequences]

    def measure(self, prompts: list[list[int]], batched: bool) -> dict[str, Any]:
        started = time.perf_counter()
        groups = [prompts] if batched else [[p] for p in prompts]
        tokens = [t for group in groups for t in self.generate(group)]
        return variant_record(tokens, 0, [time.perf_counter() - started])


def compare(ctx: BenchContext, ns: argparse.Namespace) -> dict[str, Any]:
    """All four variants; the engine ones run --repeats interleaved rounds, transformers' once each."""
    params = renoise_params(ns)
    prompts = ctx.prompts(ns.num_prompts, ns.prompt_tokens)
    engines = {
        "engine": engine_variant(ctx, ns, params, batched=False),
        "engine-batched": engine_variant(ctx, ns, params, batched=True),
    }
    reference = TransformersGenerate(ctx, params)
    reference.generate([prompts[0][:8]])  # warm-up, not timed
    variants: dict[str, dict[str, Any]] = {}
    for round_index in range(ns.repeats):
        for name, variant in engines.items():
            print(f"compare: {name}, round {round_index + 1}", file=sys.stderr, flush=True)
            variant.measure(prompts, params)
        if round_index == 0:
            for name in ("transformers", "transformers-batched"):
                print(f"compare: {name}", file=sys.stderr, flush=True)
                variants[name] = reference.measure(prompts, batched=name == "transformers-batched")
    variants |= {name: variant.result() for name, variant in engines.items()}
    variants = {name: variants[name] for name in VARIANTS}
    exact = [variants[n]["token_ids"] for n in SAME_TOKENS]
    agreement = {n: _agreement(variants["transformers"]["token_ids"], variants[n]["token_ids"]) for n in SAME_TOKENS}
    agreement["transformers-batched"] = _agreement(
        variants["transformers"]["token_ids"], variants["transformers-batched"]["token_ids"]
    )
    for v in variants.values():
        del v["token_ids"]
    ratios = {
        f"{fast}_vs_{slow}": variants[fast]["tokens_per_s"] / variants[slow]["tokens_per_s"]
        for fast, slow, _ in TARGETS
    }
    return {
        "block_length": ctx.args.block_length,
        "variants": variants,
        "ratios": ratios,
        "identical_tokens": all(t == exact[0] for t in exact),
        "token_agreement_with_transformers": agreement,
    }


def _agreement(expected: list[list[int]], got: list[list[int]]) -> float:
    """The share of output positions where `got` has `expected`'s token."""
    total = sum(max(len(e), len(g)) for e, g in zip(expected, got, strict=True))
    same = sum(a == b for e, g in zip(expected, got, strict=True) for a, b in zip(e, g))
    return same / total if total else 1.0


def table(result: dict[str, Any]) -> str:
    agreement = result["token_agreement_with_transformers"]
    rows = [
        [name, v["tokens_per_s"], v["nfe"], v["wall_s"], agreement.get(name, "-")]
        for name, v in result["variants"].items()
    ]
    return format_table(["variant", "tok/s", "NFE", "wall s", "tokens = transformers'"], rows)


def run(ns: argparse.Namespace, ctx: BenchContext) -> int:
    result = compare(ctx, ns)
    print(table(result))
    met = []
    for fast, slow, minimum in TARGETS:
        ratio = result["ratios"][f"{fast}_vs_{slow}"]
        ok = ratio >= minimum
        met.append({"variant": fast, "versus": slow, "ratio": ratio, "minimum": minimum, "met": ok})
        print(f"{fast} {ratio:.2f}x {slow} (target >= {minimum}x): {'met' if ok else 'NOT met'}")
    params = renoise_params(ns)
    finish(
        {
            **ctx.run_record("compare"),
            "workload": {
                "prompt_tokens": ns.prompt_tokens,
                "output_tokens": ns.output_tokens,
                "num_prompts": ns.num_prompts,
                "repeats": ns.repeats,
                **decoding(ctx, params),
            },
            "results": [result],
            "targets": met,
            "peak_memory_bytes": peak_memory_bytes(ctx.device),
        },
        ns.json_out,
        ns.plot,
    )
    if not result["identical_tokens"]:
        print(
            f"compare: {', '.join(SAME_TOKENS)} differ in some tokens: they draw the same numbers, so their "
            "forwards' rounding differs",
            flush=True,
        )
    return 0
