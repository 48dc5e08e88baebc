"""Which readings `bench sweep` measures for a model, and each one's batched peer (bench/sweep_peers.py):

  sdar            diffusion  the engine at the model's block length vs transformers-kv-batched
  llada2          diffusion  the engine vs recompute-batched (dFactory's generate on a batch)
  clover_moe      ar         the engine at block length 1 vs transformers' Qwen3_5MoeForCausalLM.generate
                  diffusion  the engine vs engine-static: the same engine as a static batcher (every request
                             admitted together once the last has arrived, every row computed until the batch's last
                             row is done, as the other peers), the engine's own static-batch baseline
  diffusion_gemma diffusion  the engine vs transformers' DiffusionGemmaForBlockDiffusion.generate batched

Also the engine's side: the sampling parameters of a request and a fresh, warmed-up engine per row. Knows nothing
of the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from diffuserve.bench.context import BenchContext, max_model_len
from diffuserve.bench.sweep_block_peer import BlockDiffusionPeer, BlockForward, KvForward, RecomputeForward
from diffuserve.bench.sweep_engine import EngineRun, drive
from diffuserve.bench.sweep_peers import Peer, PeerRun, TransformersGeneratePeer
from diffuserve.bench.sweep_workload import SweepRequest
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.loader import load_args
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class Reading:
    name: str
    block_length: int
    make_peer: Callable[[], Peer]
    exact: bool = True
    """Whether the peer decodes exactly the engine's tokens on the best case (not for sampled renoise canvases)."""


def family_name(ctx: BenchContext) -> str:
    return load_args(ctx.model_dir)[0].name


def request_params(ns: argparse.Namespace) -> Callable[[SweepRequest], SamplingParams]:
    """Temperature 0; EOS ignored, the workload's stop ids stop (both sides apply the same rule)."""

    def params(request: SweepRequest) -> SamplingParams:
        return SamplingParams(
            max_tokens=request.max_tokens,
            ignore_eos=True,
            stop_token_ids=list(request.stop_token_ids),
            temperature=0.0,
            seed=ns.seed,
            steps=ns.denoising_steps,
        )

    return params


def fresh_engine(ctx: BenchContext, ns: argparse.Namespace, block: int, concurrency: int) -> LLMEngine:
    """An engine for `concurrency` whole sequences (no prefix cache, no expert statistics: the sweep reports none),
    warmed up by two short requests."""
    length = max_model_len(ns.prompt_tokens, ns.output_tokens, block)
    prefill = {} if ns.max_prefill_tokens is None else {"max_prefill_tokens": ns.max_prefill_tokens}
    engine = ctx.engine(block, concurrency, length, enable_prefix_caching=False, expert_stats=False, **prefill)
    warm = ctx.prompts(2, ns.prompt_tokens)
    params = SamplingParams(max_tokens=min(ns.output_tokens, 2 * block), ignore_eos=True, steps=ns.denoising_steps)
    for i, prompt in enumerate(warm):
        engine.add_request(f"sweep-warm-{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    return engine


class EngineStaticPeer:
    """The engine as a static batcher, the sweep's other peers' rule: every request admitted together at the last
    arrival, and every row computed until the batch's last row is done, as `generate` keeps finished rows in the
    batch until all are finished. An untimed first run finds where each request ends (its stop id or length); the
    timed run gives every request the batch's longest output and no stop ids, and each row's tokens are cut at its
    own end (only the tokens before it count as delivered)."""

    name = "engine-static"

    def __init__(self, ctx: BenchContext, ns: argparse.Namespace, block: int) -> None:
        self.ctx, self.ns, self.block = ctx, ns, block

    def run(self, requests: list[SweepRequest]) -> PeerRun:
        own = request_params(self.ns)
        ends = [len(trace.tokens) for trace in self._drive(requests, own).traces]
        batch_end = max(ends)
        run = self._drive(requests, lambda r: own(r).replace(max_tokens=batch_end, stop_token_ids=[]))
        for trace, end in zip(run.traces, ends, strict=True):
            trace.keep_first(end)
        return PeerRun(run.traces, run.wall_s)

    def _drive(self, requests: list[SweepRequest], params: Callable[[SweepRequest], SamplingParams]) -> EngineRun:
        engine = fresh_engine(self.ctx, self.ns, self.block, len(requests))
        run = drive(engine, requests, params, static=True)
        engine.shutdown()
        return run


def _pad_id(ctx: BenchContext) -> int:
    args = ctx.args
    return args.pad_token_id if args.pad_token_id is not None else (args.eos_token_ids or [0])[0]


def _block_peer(ctx: BenchContext, ns: argparse.Namespace, name: str, forward: BlockForward) -> Peer:
    """A static block-diffusion batch decoding with the request's resolved threshold and steps (LLaDA2's capped)."""
    resolved = SamplingParams(steps=ns.denoising_steps).with_defaults(ctx.generation_defaults)
    args, capped = ctx.args, family_name(ctx) == "llada2"
    threshold, pad = float(resolved.threshold or 0.9), _pad_id(ctx)
    return BlockDiffusionPeer(
        name, forward, args.block_length, args.mask_token_id, pad, threshold, resolved.steps, capped
    )


def _sdar_peer(ctx: BenchContext, ns: argparse.Namespace) -> Peer:
    from diffuserve.bench.hf_reference import load_transformers_model

    return _block_peer(
        ctx, ns, "transformers-kv-batched", KvForward(load_transformers_model(ctx.model_dir, ctx.dtype).hf)
    )


def _llada2_peer(ctx: BenchContext, ns: argparse.Namespace) -> Peer:
    from diffuserve.model.loader import load_model

    model = load_model(ctx.model_dir, dtype=ctx.dtype)[1].eval()
    return _block_peer(ctx, ns, "recompute-batched", RecomputeForward(model))


def _clover_ar_peer(ctx: BenchContext, ns: argparse.Namespace) -> Peer:
    from diffuserve.model.loader import read_model_config
    from diffuserve.verify.reference import choose_reference

    reference = choose_reference(read_model_config(ctx.model_dir)[0], family_name(ctx), False)[0]
    assert reference is not None, "transformers has Qwen3_5MoeForCausalLM"
    model = reference.build(ctx.model_dir, getattr(torch, ctx.dtype))[0]
    # the mask token is no output token: the engine never writes it, so transformers is told the same
    extra = {"suppress_tokens": [ctx.args.mask_token_id]}
    return TransformersGeneratePeer("transformers-generate", model, _pad_id(ctx), 1, extra)


def _gemma_peer(ctx: BenchContext, ns: argparse.Namespace) -> Peer:
    from diffuserve.bench.renoise_compare import TransformersGenerate

    hf = TransformersGenerate(
        ctx, SamplingParams(max_tokens=1, ignore_eos=True, seed=ns.seed, steps=ns.denoising_steps)
    )
    extra = {"generation_config": hf.config, "never": ctx.args.vocab_size, "seed": ns.seed}
    return TransformersGeneratePeer("transformers-generate", hf.model, _pad_id(ctx), ctx.args.block_length, extra)


def readings(ctx: BenchContext, ns: argparse.Namespace) -> list[Reading]:
    block, family = ctx.args.block_length, family_name(ctx)
    by_family = {
        "sdar": [Reading("diffusion", block, partial(_sdar_peer, ctx, ns))],
        "llada2": [Reading("diffusion", block, partial(_llada2_peer, ctx, ns))],
        "clover_moe": [
            Reading("ar", 1, partial(_clover_ar_peer, ctx, ns)),
            Reading("diffusion", block, partial(EngineStaticPeer, ctx, ns, block)),
        ],
        "diffusion_gemma": [Reading("diffusion", block, partial(_gemma_peer, ctx, ns), exact=False)],
    }
    if family not in by_family:
        raise ValueError(f"model: bench sweep knows no batched peer for the {family} family")
    return by_family[family]
