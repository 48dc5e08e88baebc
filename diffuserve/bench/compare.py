"""`diffuserve bench compare`: the same model, prompts and decoding, side by side in one run:

  (a)  engine           diffuserve: KV cache, fused commit (--moe-backend, --enforce-eager as given)
  (a0) baseline         the same engine eager, with the per-expert loop: the engine's plain batch-1 path
  (b)  reference        transformers' model recomputing the whole sequence every step (LLaDA2 reference generate)
  (b2) transformers-kv  transformers' model with its KV cache, decoded by the SDAR scheme (separate commit
                        forward): what a user runs without an engine
  (c)  separate-commit  diffuserve with a separate commit forward per block (SGLang, dInfer, the SDAR reference)
  (d)  ar               the same model decoded autoregressively (block length 1): the AR baseline; ar-batched
                        (only when asked) the same given every prompt at once
  (e)  engine-batched   (only when asked) the engine given all --num-prompts prompts at once
  (f)  recompute-state  hybrid models (GDN layers): diffuserve recomputing every request's committed prefix each
                        step through the whole model, with no cache at all (bench/baselines/recompute.py)
  (g)  gdn-rescan       hybrid models: diffuserve with its K/V pages cached as usual but no GDN state carried
                        between steps: every step rebuilds it by scanning the committed prefix's kept
                        projections (bench/baselines/rescan.py)
  (i)  verified         (only when asked) the engine with decoder=verified: one-forward drafts kept only where the
                        causal path agrees, so its tokens must equal (d)'s; verified-batched: given every prompt at
                        once, as (e); auto, auto-batched: the same with decoder=auto (drafts switched per step by
                        --auto-draft-tokens)
  (h)  attention-loop   (only when asked) engine-batched with --attention-backend loop: one SDPA per sequence in
                        every layer, the attention without batching (engine-batched_vs_attention-loop: the gain of
                        the batched attention backend at --num-prompts concurrent sequences)

For a hybrid model (clover_moe) the reference (b) is the naive clover_moe decode of diffuserve/reference (prefix
recomputed causally every step, then the block previewed), since transformers has no block-diffusion GDN.

Every other variant than (e) and (h) decodes each prompt alone (batch 1), so the ratios isolate the decoding
method; (e) shows what batching adds over the one-at-a-time peers. tokens/s = generated tokens / wall time,
prefill included (for the engine variants the median of interleaved rounds). At temperature 0, (a), (a0), (b),
(b2), (c), (e), (f), (g) and (h) must give identical tokens: the run checks it and exits 1 if not. Knows nothing
of CLI parsing.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from diffuserve.bench import renoise_compare
from diffuserve.bench.context import BenchContext, decoding, make_context, max_model_len, sampling_params
from diffuserve.bench.engine_run import run_requests
from diffuserve.bench.environment import peak_memory_bytes
from diffuserve.bench.hf_reference import load_transformers_model
from diffuserve.bench.report import finish, format_table, variant_record
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference
from diffuserve.sampling_defaults import RENOISE
from diffuserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from diffuserve.model.families.clover_moe.dense import HybridState
    from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion

VARIANT_ORDER = (
    "engine",
    "engine-batched",
    "attention-loop",
    "baseline",
    "reference",
    "transformers-kv",
    "separate-commit",
    "ar",
    "ar-batched",
    "verified",
    "verified-batched",
    "auto",
    "auto-batched",
    "recompute-state",
    "gdn-rescan",
)
ENGINE_VARIANTS = (
    "verified",
    "verified-batched",
    "auto",
    "auto-batched",
    "engine",
    "engine-batched",
    "attention-loop",
    "baseline",
    "separate-commit",
    "recompute-state",
    "gdn-rescan",
)
SAME_TOKENS = (
    "engine",
    "engine-batched",
    "attention-loop",
    "attention-loop",
    "baseline",
    "reference",
    "transformers-kv",
    "separate-commit",
    "recompute-state",
    "gdn-rescan",
)
BASELINE_RUNNERS = {"recompute-state": "recompute", "gdn-rescan": "rescan"}
"""The hybrid-model baselines: variant -> its runner (bench/baselines)."""
ALL_AT_ONCE = ("engine-batched", "attention-loop", "verified-batched", "auto-batched", "ar-batched")
AUTOREGRESSIVE = ("ar", "ar-batched")
"""The variants at block length 1, built once and measured beside every block length's."""
VERIFIED = ("verified", "verified-batched", "auto", "auto-batched")
"""The variants decoding with decoder=verified or auto: their tokens are the autoregressive ones, checked against
(d)."""
EXACT_PAIRS = (("verified", "ar"), ("verified-batched", "ar-batched"), ("auto", "ar"), ("auto-batched", "ar-batched"))
"""(variant, its autoregressive peer): the speed-ups of the readings whose tokens are the autoregressive ones."""
"""The variants given every prompt at once (the others decode each prompt alone)."""
TARGETS = (
    (32, "engine", "reference", 5.0),
    (4, "engine", "separate-commit", 1.15),
    (32, "engine", "baseline", 3.0),
    (32, "engine", "transformers-kv", 4.0),
    (32, "engine-batched", "transformers-kv", 10.0),
    (32, "engine", "gdn-rescan", 2.0),
)
"""(block length, variant, slower variant, minimum speed-up over it): the speed-up targets the engine is held to
(engine-batched: with --num-prompts 16, the 16-concurrent target)."""


@dataclass
class EngineVariant:
    """A variant decoded by a diffuserve engine; its repetitions are interleaved with the other variants'."""

    engine: LLMEngine
    walls: list[float] = field(default_factory=list)
    tokens: list[list[int]] | None = None
    nfe: int = 0
    sequential: bool = True
    compile_s: float = 0.0
    """Seconds the warm-up spent compiling the forward (0 when eager); never part of the timed rounds."""
    decoder: str | None = None
    """The decoder this variant asks for instead of the run's (verified)."""

    def measure(self, prompts: list[list[int]], params: SamplingParams) -> None:
        params = params.replace(decoder=self.decoder) if self.decoder else params
        record = run_requests(self.engine, prompts, params, sequential=self.sequential)
        tokens = [o.outputs[0].token_ids for o in record.outputs]
        if self.tokens is not None and tokens != self.tokens:
            raise RuntimeError("compare: an engine variant gave different tokens on a repetition")
        self.tokens, self.nfe = tokens, record.num_forwards
        self.walls.append(record.wall_s)

    def result(self) -> dict[str, Any]:
        assert self.tokens is not None, "measure() first"
        record = variant_record(self.tokens, self.nfe, self.walls) | {"compile_s": self.compile_s}
        spec = self.engine.stats().spec_decode
        if spec.num_drafts:
            record |= {"acceptance_rate": spec.acceptance_rate, "mean_acceptance_length": spec.mean_acceptance_length}
        return record


def engine_variant(
    ctx: BenchContext, ns: argparse.Namespace, block: int, params: SamplingParams, name: str = "engine"
) -> EngineVariant:
    """A fresh engine (no prefix cache: repetitions must recompute the prompt as the reference does; one
    sequence, except engine-batched and attention-loop), warmed up by one request of two blocks on a prompt that
    is not measured (and, for a compiled forward, by every step shape the measured runs will see: the warm-up's
    compile is reported, never timed)."""
    batched = name in ALL_AT_ONCE
    options: dict[str, Any] = {"moe_backend": "loop", "enforce_eager": True} if name == "baseline" else {}
    if name == "attention-loop":
        options["attention_backend"] = "loop"
    engine = ctx.engine(
        block,
        ns.num_prompts if batched else 1,
        max_model_len(ns.prompt_tokens, ns.output_tokens, block),
        BASELINE_RUNNERS.get(name),
        fused_commit=name != "separate-commit",
        enable_prefix_caching=False,
        **options,
    )
    warm = ctx.prompts(ns.num_prompts + 1, ns.prompt_tokens)[-1]
    run_requests(engine, [warm], params.replace(max_tokens=min(params.max_tokens or 1, 2 * block)))
    compile_s = engine.runner.executor.run_model.compile_s
    if compile_s:
        print(f"compare: {name} compiled its forward in {compile_s:.1f} s (warm-up, not timed)", file=sys.stderr)
    decoder = name.removesuffix("-batched") if name in VERIFIED else None
    return EngineVariant(engine, sequential=not batched, compile_s=compile_s, decoder=decoder)


def reference_variant(
    ctx: BenchContext, block: int, prompts: list[list[int]], params: SamplingParams, cached: bool = False
) -> dict[str, Any]:
    """transformers' model under the block-causal mask: the whole sequence recomputed every step, or (cached)
    the SDAR scheme over its KV cache."""
    model = load_transformers_model(ctx.model_dir, ctx.dtype, sdar_cache_block=block if cached else None)
    reference = load_reference(ctx.model_dir, model=model, block_length=block)
    resolved = params.with_defaults(ctx.generation_defaults)
    with torch.inference_mode():  # warm-up: one full forward of a prompt
        model.compute_logits(
            model(
                torch.tensor(prompts[0])[None], torch.arange(len(prompts[0]))[None], _dense_mask(len(prompts[0]), block)
            )[0, -1:]
        )
    tokens, nfe = [], 0
    started = time.perf_counter()
    for prompt in prompts:
        generator = torch.Generator().manual_seed(resolved.seed or 0) if not resolved.is_greedy else None
        result = reference_generate(reference, prompt, params, generator)
        tokens.append(result.token_ids)
        nfe += result.num_forwards
    return variant_record(tokens, nfe, [time.perf_counter() - started])


def hybrid_reference_variant(
    ctx: BenchContext, block: int, prompts: list[list[int]], params: SamplingParams
) -> dict[str, Any]:
    """The naive clover_moe decode (reference/reference_clover_moe.py): prefix recomputed every step; temperature 0."""
    from diffuserve.model.families.clover_moe.dense import DenseClover
    from diffuserve.model.loader import load_model
    from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode

    resolved = params.with_defaults(ctx.generation_defaults)
    if not resolved.is_greedy or resolved.decoder != "threshold":
        raise ValueError(
            "compare: the clover_moe reference decodes at temperature 0 with the threshold decoder; "
            "drop --temperature / --decoder"
        )
    args = ctx.args.replace(block_length=block)
    _, model = load_model(ctx.model_dir, ctx.dtype, str(ctx.device), args=args)
    counted = _CountingModel(DenseClover(cast("CloverMoeForBlockDiffusion", model)))
    settings = ReferenceSettings(max_new_tokens=resolved.max_tokens or 1, threshold=resolved.threshold)
    tokens = []
    started = time.perf_counter()
    for prompt in prompts:
        tokens.append(reference_block_decode(counted, prompt, settings))
    return variant_record(tokens, counted.num_forwards, [time.perf_counter() - started])


class _CountingModel:
    """The reference's model, counting its denoising forwards (one preview per step)."""

    def __init__(self, model: Any) -> None:
        self.model, self.num_forwards = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward_preview(self, input_ids: torch.Tensor, state: HybridState | None = None) -> torch.Tensor:
        self.num_forwards += 1
        return self.model.forward_preview(input_ids, state)


def _dense_mask(length: int, block: int) -> StepInputs:
    return StepInputs(DenseAttentionInputs(block_causal_mask(torch.arange(length), length, block)[None, None]))


def compare_block(
    ctx: BenchContext,
    ns: argparse.Namespace,
    block: int,
    prompts: list[list[int]],
    params: SamplingParams,
    block_one: dict[str, EngineVariant],
) -> dict[str, Any]:
    """All variants at one block length. The engine variants run --repeats rounds, interleaved (a, c, d, a,
    c, d, ...) so that a change in machine load hits them alike; the slow reference runs once, after the
    first round."""
    engines = {name: engine_variant(ctx, ns, block, params, name) for name in ns.variants if name in ENGINE_VARIANTS}
    for name, variant in block_one.items():
        variant.walls = []  # AR is measured again in every block's rounds, beside that block's variants
        engines[name] = variant
    variants: dict[str, dict[str, Any]] = {}
    for round_index in range(ns.repeats):
        for name, variant in engines.items():
            print(f"compare: block {block}, {name}, round {round_index + 1}", file=sys.stderr, flush=True)
            variant.measure(prompts, params)
        for name in ("reference", "transformers-kv"):
            if round_index == 0 and name in ns.variants:
                print(f"compare: block {block}, {name}", file=sys.stderr, flush=True)
                if "hybrid" in ctx.args.extra:
                    if name == "reference":
                        variants[name] = hybrid_reference_variant(ctx, block, prompts, params)
                else:
                    variants[name] = reference_variant(ctx, block, prompts, params, cached=name == "transformers-kv")
    variants |= {name: variant.result() for name, variant in engines.items()}
    variants = {name: variants[name] for name in VARIANT_ORDER if name in variants}
    exact = [variants[n]["token_ids"] for n in SAME_TOKENS if n in variants]
    autoregressive = [variants[n]["token_ids"] for n in (*AUTOREGRESSIVE, *VERIFIED) if n in variants]
    for v in variants.values():
        del v["token_ids"]  # checked here; the JSON keeps the verdict, not 3 x prompts x tokens ids
    ratios = {
        f"{fast}_vs_{n}": variants[fast]["tokens_per_s"] / v["tokens_per_s"]
        for fast in ("engine", "engine-batched")
        if fast in variants
        for n, v in variants.items()
        if n not in ("engine", "engine-batched")
    } | {
        f"{fast}_vs_{peer}": variants[fast]["tokens_per_s"] / variants[peer]["tokens_per_s"]
        for fast, peer in EXACT_PAIRS
        if fast in variants and peer in variants
    }
    return {
        "block_length": block,
        "variants": variants,
        "ratios": ratios,
        "identical_tokens": all(t == exact[0] for t in exact) if len(exact) > 1 else None,
        "verified_equals_ar": all(t == autoregressive[0] for t in autoregressive) if len(autoregressive) > 1 else None,
    }


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    met = []
    for block, fast, variant, minimum in TARGETS:
        row = next((r for r in results if r["block_length"] == block), None)
        ratio = row["ratios"].get(f"{fast}_vs_{variant}") if row else None
        if row is not None and ratio is not None:
            met.append(
                {
                    "block_length": block,
                    "variant": fast,
                    "versus": variant,
                    "ratio": ratio,
                    "minimum": minimum,
                    "met": ratio >= minimum and bool(row["identical_tokens"]),
                }
            )
    return met


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        for name, v in r["variants"].items():
            ratio = r["ratios"].get(f"engine_vs_{name}", 1.0 if name == "engine" else None)
            rows.append(
                [
                    r["block_length"],
                    name,
                    v["tokens_per_s"],
                    v["nfe"],
                    v["tpf"],
                    v["forwards_per_s"],
                    v["wall_s"],
                    ratio,
                    {True: "yes", False: "NO", None: "-"}[r["identical_tokens"]],
                ]
            )
    return format_table(["block", "variant", "tok/s", "NFE", "TPF", "fwd/s", "wall s", "engine x", "same tokens"], rows)


def run(ns: argparse.Namespace) -> int:
    ctx = make_context(ns)
    if ctx.generation_defaults.get("decoder") == RENOISE:  # renoise canvases: against transformers' generate
        return renoise_compare.run(ns, ctx)
    prompts = ctx.prompts(ns.num_prompts, ns.prompt_tokens)
    params = sampling_params(ns, ns.output_tokens)
    block_one = {name: engine_variant(ctx, ns, 1, params, name) for name in AUTOREGRESSIVE if name in ns.variants}
    results = [compare_block(ctx, ns, block, prompts, params, block_one) for block in ns.block_lengths]
    print(table(results))
    for r in results:
        if "engine-batched_vs_attention-loop" in r["ratios"]:
            ratio = r["ratios"]["engine-batched_vs_attention-loop"]
            print(f"block {r['block_length']}: engine-batched {ratio:.2f}x attention-loop, {ns.num_prompts} sequences")
    for t in targets(results):
        print(
            f"block {t['block_length']}: {t['variant']} {t['ratio']:.2f}x {t['versus']} (target >= {t['minimum']}x): "
            f"{'met' if t['met'] else 'NOT met'}"
        )
    finish(
        {
            **ctx.run_record("compare"),
            "workload": {
                "prompt_tokens": ns.prompt_tokens,
                "output_tokens": ns.output_tokens,
                "num_prompts": ns.num_prompts,
                "block_lengths": ns.block_lengths,
                "batch_size": 1,
                "repeats": ns.repeats,
                **decoding(ctx, params),
            },
            "results": results,
            "targets": targets(results),
            "peak_memory_bytes": peak_memory_bytes(ctx.device),
        },
        ns.json_out,
        ns.plot,
    )
    if any(r.get("verified_equals_ar") is False for r in results):
        print("compare: verified decoding gave other tokens than autoregressive decoding (ar)", flush=True)
        return 1
    if any(r["identical_tokens"] is False for r in results):
        print(
            f"compare: the variants {', '.join(n for n in SAME_TOKENS if n in ns.variants)} gave different tokens",
            flush=True,
        )
        return 1
    return 0
