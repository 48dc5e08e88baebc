"""`diffuserve bench compare`: the same model, prompts and decoding, side by side in one run:

  (a) engine           diffuserve: KV cache, fused commit
  (b) reference        transformers' model recomputing the whole sequence every step (LLaDA2 reference generate)
  (c) separate-commit  diffuserve with a separate commit forward per block (SGLang, dInfer, the SDAR reference)
  (d) ar               the same model decoded autoregressively (block length 1): the AR baseline
  (e) recompute-state  hybrid models (GDN layers): diffuserve recomputing every request's committed prefix each
                       step instead of keeping its recurrent state (--recurrent-state recompute)

For a hybrid model (clover_moe) the reference (b) is the naive clover_moe decode of diffuserve/testing (prefix
recomputed causally every step, then the block previewed), since transformers has no block-diffusion GDN.

Every prompt is decoded alone (batch 1), so the ratios isolate the decoding method, not batching (that is
`bench throughput`). tokens/s = generated tokens / wall time, prefill included (for the engine variants the
median of interleaved rounds). At temperature 0, (a), (b) and (c) must give identical tokens: the run checks
it and exits 1 if not. Knows nothing of CLI parsing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from diffuserve.bench.context import BenchContext, decoding, make_context, max_model_len, sampling_params
from diffuserve.bench.engine_run import run_requests
from diffuserve.bench.environment import load_average, peak_memory_bytes
from diffuserve.bench.hf_reference import load_transformers_model
from diffuserve.bench.report import finish, format_table
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.layers.attention_backend import DenseAttentionInputs, block_causal_mask
from diffuserve.sampling_params import SamplingParams
from diffuserve.testing.reference_decode import reference_generate
from diffuserve.testing.reference_model import load_reference

VARIANT_ORDER = ("engine", "reference", "separate-commit", "ar", "recompute-state")
TARGETS = ((32, "reference", 5.0), (4, "separate-commit", 1.15), (32, "recompute-state", 2.0))
"""(block length, variant, minimum engine speed-up over it): the targets of issues 2, 7 and 14."""
EXACT_VARIANTS = ("engine", "reference", "separate-commit", "recompute-state")


def _variant(tokens: list[list[int]], nfe: int, walls: list[float]) -> dict[str, Any]:
    """tokens/s from the median wall time of the rounds (one round disturbed by another process moves it least)."""
    generated, seconds = sum(len(t) for t in tokens), statistics.median(walls)
    return {"generated_tokens": generated, "wall_s": seconds, "wall_s_repeats": walls,
            "tokens_per_s": generated / seconds, "nfe": nfe, "tpf": generated / nfe if nfe else 0.0,
            "forwards_per_s": nfe / seconds, "token_ids": tokens}


@dataclass
class EngineVariant:
    """A variant decoded by a diffuserve engine; its repetitions are interleaved with the other variants'."""

    engine: LLMEngine
    walls: list[float] = field(default_factory=list)
    tokens: list[list[int]] | None = None
    nfe: int = 0

    def measure(self, prompts: list[list[int]], params: SamplingParams) -> None:
        record = run_requests(self.engine, prompts, params, sequential=True)
        tokens = [o.outputs[0].token_ids for o in record.outputs]
        if self.tokens is not None and tokens != self.tokens:
            raise RuntimeError("compare: an engine variant gave different tokens on a repetition")
        self.tokens, self.nfe = tokens, record.num_forwards
        self.walls.append(record.wall_s)

    def result(self) -> dict[str, Any]:
        assert self.tokens is not None, "measure() first"
        return _variant(self.tokens, self.nfe, self.walls)


def engine_variant(ctx: BenchContext, ns: argparse.Namespace, block: int, params: SamplingParams,
                   fused_commit: bool, recurrent_state: str = "keep") -> EngineVariant:
    """A fresh engine (one sequence, no prefix cache: repetitions must recompute the prompt as the reference
    does), warmed up by one request of two blocks on a prompt that is not measured."""
    engine = ctx.engine(block, 1, max_model_len(ns.prompt_tokens, ns.output_tokens, block),
                        fused_commit=fused_commit, enable_prefix_caching=False, recurrent_state=recurrent_state)
    warm = ctx.prompts(ns.num_prompts + 1, ns.prompt_tokens)[-1]
    run_requests(engine, [warm], params.replace(max_tokens=min(params.max_tokens or 1, 2 * block)))
    return EngineVariant(engine)


def reference_variant(ctx: BenchContext, block: int, prompts: list[list[int]],
                      params: SamplingParams) -> dict[str, Any]:
    """transformers' model under the block-causal mask, whole sequence recomputed every step."""
    model = load_transformers_model(ctx.model_dir, ctx.dtype)
    reference = load_reference(ctx.model_dir, model=model, block_length=block)
    resolved = params.with_defaults(ctx.generation_defaults)
    with torch.inference_mode():  # warm-up: one full forward of a prompt
        model.compute_logits(model(torch.tensor(prompts[0])[None], torch.arange(len(prompts[0]))[None],
                                   _dense_mask(len(prompts[0]), block))[0, -1:])
    tokens, nfe = [], 0
    started = time.perf_counter()
    for prompt in prompts:
        generator = torch.Generator().manual_seed(resolved.seed or 0) if not resolved.is_greedy else None
        result = reference_generate(reference, prompt, params, generator)
        tokens.append(result.token_ids)
        nfe += result.num_forwards
    return _variant(tokens, nfe, [time.perf_counter() - started])


def hybrid_reference_variant(ctx: BenchContext, block: int, prompts: list[list[int]],
                             params: SamplingParams) -> dict[str, Any]:
    """The naive clover_moe decode (testing/reference_clover_moe): prefix recomputed every step; temperature 0."""
    from diffuserve.model.loader import load_model
    from diffuserve.testing.reference_clover_moe import ReferenceSettings, reference_block_decode

    resolved = params.with_defaults(ctx.generation_defaults)
    if not resolved.is_greedy or resolved.decoder != "threshold":
        raise ValueError("compare: the clover_moe reference decodes at temperature 0 with the threshold decoder; "
                         "drop --temperature / --decoder")
    args = ctx.args.replace(block_length=block)
    _, model = load_model(ctx.model_dir, ctx.dtype, str(ctx.device), args=args)
    counted = _CountingModel(model)
    settings = ReferenceSettings(max_new_tokens=resolved.max_tokens or 1, threshold=resolved.threshold)
    tokens = []
    started = time.perf_counter()
    for prompt in prompts:
        tokens.append(reference_block_decode(counted, prompt, settings))
    return _variant(tokens, counted.num_forwards, [time.perf_counter() - started])


class _CountingModel:
    """The reference's model, counting its denoising forwards (one preview per step)."""

    def __init__(self, model: Any) -> None:
        self.model, self.num_forwards = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward_preview(self, *args: Any) -> Any:
        self.num_forwards += 1
        return self.model.forward_preview(*args)


def _dense_mask(length: int, block: int) -> DenseAttentionInputs:
    return DenseAttentionInputs(block_causal_mask(torch.arange(length), length, block)[None, None])


def compare_block(ctx: BenchContext, ns: argparse.Namespace, block: int, prompts: list[list[int]],
                  params: SamplingParams, ar: EngineVariant | None) -> dict[str, Any]:
    """All variants at one block length. The engine variants run --repeats rounds, interleaved (a, c, d, a,
    c, d, ...) so that a change in machine load hits them alike; the slow reference runs once, after the
    first round."""
    engines = {name: engine_variant(ctx, ns, block, params, fused_commit=name != "separate-commit",
                                    recurrent_state="recompute" if name == "recompute-state" else "keep")
               for name in ns.variants if name in ("engine", "separate-commit", "recompute-state")}
    if ar is not None:
        ar.walls = []  # AR is measured again in every block's rounds, beside that block's variants
        engines["ar"] = ar
    variants: dict[str, dict[str, Any]] = {}
    for round_index in range(ns.repeats):
        for name, variant in engines.items():
            print(f"compare: block {block}, {name}, round {round_index + 1}", file=sys.stderr, flush=True)
            variant.measure(prompts, params)
        if round_index == 0 and "reference" in ns.variants:
            print(f"compare: block {block}, reference", file=sys.stderr, flush=True)
            hybrid = "hybrid" in ctx.args.extra
            variants["reference"] = (hybrid_reference_variant if hybrid else reference_variant)(ctx, block, prompts,
                                                                                               params)
    variants |= {name: variant.result() for name, variant in engines.items()}
    variants = {name: variants[name] for name in VARIANT_ORDER if name in variants}
    exact = [variants[n]["token_ids"] for n in EXACT_VARIANTS if n in variants]
    for v in variants.values():
        del v["token_ids"]  # checked here; the JSON keeps the verdict, not 3 x prompts x tokens ids
    ratios = {f"engine_vs_{n}": variants["engine"]["tokens_per_s"] / v["tokens_per_s"]
              for n, v in variants.items() if n != "engine" and "engine" in variants}
    return {"block_length": block, "variants": variants, "ratios": ratios,
            "identical_tokens": all(t == exact[0] for t in exact) if len(exact) > 1 else None}


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    met = []
    for block, variant, minimum in TARGETS:
        row = next((r for r in results if r["block_length"] == block), None)
        ratio = row["ratios"].get(f"engine_vs_{variant}") if row else None
        if ratio is not None:
            met.append({"block_length": block, "versus": variant, "ratio": ratio, "minimum": minimum,
                        "met": ratio >= minimum and bool(row["identical_tokens"])})
    return met


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        for name, v in r["variants"].items():
            ratio = 1.0 if name == "engine" else r["ratios"].get(f"engine_vs_{name}")
            rows.append([r["block_length"], name, v["tokens_per_s"], v["nfe"], v["tpf"], v["forwards_per_s"],
                         v["wall_s"], ratio, {True: "yes", False: "NO", None: "-"}[r["identical_tokens"]]])
    return format_table(["block", "variant", "tok/s", "NFE", "TPF", "fwd/s", "wall s", "engine x", "same tokens"],
                        rows)


def run(ns: argparse.Namespace) -> int:
    ctx = make_context(ns)
    prompts = ctx.prompts(ns.num_prompts, ns.prompt_tokens)
    params = sampling_params(ns, ns.output_tokens)
    ar = engine_variant(ctx, ns, 1, params, fused_commit=True) if "ar" in ns.variants else None
    results = [compare_block(ctx, ns, block, prompts, params, ar) for block in ns.block_lengths]
    print(table(results))
    for t in targets(results):
        print(f"block {t['block_length']}: engine {t['ratio']:.2f}x {t['versus']} (target >= {t['minimum']}x): "
              f"{'met' if t['met'] else 'NOT met'}")
    finish({
        "bench": "compare", "environment": {**ctx.environment, "load_average_end": load_average()},
        "model": ctx.model_info, "dtype": ctx.dtype, "machine": ctx.rates.to_json(),
        "workload": {"prompt_tokens": ns.prompt_tokens, "output_tokens": ns.output_tokens,
                     "num_prompts": ns.num_prompts, "block_lengths": ns.block_lengths, "batch_size": 1,
                     "repeats": ns.repeats,
                     **decoding(ctx, params)},
        "results": results, "targets": targets(results), "peak_memory_bytes": peak_memory_bytes(ctx.device),
    }, ns.json_out, ns.plot)
    if any(r["identical_tokens"] is False for r in results):
        print("compare: (a) engine, (b) reference, (c) separate-commit and (e) recompute-state gave different tokens",
              flush=True)
        return 1
    return 0
