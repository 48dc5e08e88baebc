"""The families of the option matrix (reference/option_matrix.py): a tiny seeded checkpoint of each, and each
family's independent reference decode, run under the option's arithmetic (the weights quantized the same way,
K/V rounded to e4m3) but never through the engine.

    sdar, sdar_moe, llada2   the naive recompute reference (reference_decode): every decoder, seeds, logprobs
    clover_moe               its block logits under every mask decoder (reference_hybrid_decode): seeds too;
                             decoder=verified: the autoregressive reference (reference_clover_moe), greedy
    clover_moe_ar            the same checkpoint without the diffusion tensors: the autoregressive reference
                             (reference_clover_moe), which takes the argmax whatever the mask decoder
    diffusion_gemma          transformers' own `generate` (diffusion_gemma_hf): renoise, seeds

Reference decodes are cached per (family, weights, K/V dtype, prompt, params): many cells share one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_ar_decode
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_hybrid_decode import reference_hybrid_generate
from diffuserve.reference.reference_kv_fp8 import fp8_kv_reference
from diffuserve.reference.reference_model import load_reference
from diffuserve.sampling_params import SamplingParams

QUANT_GROUP_SIZE = 16
"""`quantization_group_size` of the quantized cells: the tiny models' widths, halved by tensor parallelism, are
multiples of 16."""
MAX_MODEL_LEN = 160


@dataclass(frozen=True)
class Family:
    name: str
    write: Callable[[Path], Path]
    """Writes the family's checkpoint under a directory; returns the model directory."""
    reference: str
    """Which reference decodes it: "recompute", "clover", "clover_ar" or "transformers"."""
    engine_options: tuple[tuple[str, Any], ...] = ()
    """LLM options every cell of the family runs with."""
    preemption_pages: int = 10
    """A page budget (pages of 4 tokens) under which the matrix's requests preempt one another."""
    verified_preemption_pages: int = 8
    """The same for verified decoding: its blocks start after its whole prompt, so its first step needs more pages,
    and at 10 the third request waits for the first two to finish instead of being admitted and preempted."""
    prefix_survives_preemption: bool = True
    """Whether that budget still keeps a finished request's prefix for the next run (DiffusionGemma's window
    group needs so many pages that, at a budget that preempts, cached prefixes are evicted before reuse)."""


def _sdar(moe: bool) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        overrides: dict[str, Any] = (
            {"first_k_dense_replace": 1, "shared_expert_intermediate_size": 64} if moe else {"num_experts": 0}
        )
        return write_random_checkpoint(
            root / "sdar", make_config("sdar-moe-tiny", **overrides), seed=0, logit_scale=40.0
        )

    return write


def _llada2(root: Path) -> Path:
    return write_llada2_checkpoint(root / "llada2", {"block_length": 4}, seed=1, logit_scale=40.0)


def _clover(diffusion: bool) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        config = make_clover_moe_config(block_length=4, moe_intermediate_size=64, shared_expert_intermediate_size=64)
        return write_clover_moe_checkpoint(
            root / "clover", config, seed=12, init_std=0.1, logit_scale=20.0, diffusion=diffusion
        )

    return write


def _diffusion_gemma(root: Path) -> Path:
    from diffuserve.reference.diffusion_gemma_hf import FAST, FAST_CANVAS, write_hf_checkpoint

    return write_hf_checkpoint(root / "dg", None, FAST_CANVAS, seed=3, feedback=0.1, generation=FAST)


FAMILIES = {
    f.name: f
    for f in [
        Family("sdar", _sdar(False), "recompute"),
        Family("sdar_moe", _sdar(True), "recompute"),
        Family("llada2", _llada2, "recompute", (("block_length", 4),)),
        Family("clover_moe", _clover(True), "clover"),
        Family("clover_moe_ar", _clover(False), "clover_ar"),
        Family(
            "diffusion_gemma",
            _diffusion_gemma,
            "transformers",
            (("dtype", "float32"),),
            preemption_pages=7,
            prefix_survives_preemption=False,
        ),
    ]
}


@functools.cache
def _reference_model(family: str, model_dir: str, quantization: str | None) -> Any:
    """The family's reference model: its own load of the checkpoint (quantized as the cell's engine is)."""
    if FAMILIES[family].reference == "transformers":
        from diffuserve.reference.diffusion_gemma_hf import load_hf_model

        return load_hf_model(model_dir)
    scheme = make_scheme(quantization, group_size=QUANT_GROUP_SIZE) if quantization else None
    _, model = load_model(model_dir, quantization=scheme)
    options = dict(FAMILIES[family].engine_options)
    return load_reference(model_dir, model=model, block_length=options.get("block_length"))


def _kv_context(family: str, kv_fp8: bool) -> AbstractContextManager[None]:
    if not kv_fp8:
        return nullcontext()
    if FAMILIES[family].reference == "transformers":
        from diffuserve.reference.diffusion_gemma_hf import hf_kv_fp8

        return hf_kv_fp8()
    return fp8_kv_reference()


_ANSWERS: dict[str, tuple[int, ...]] = {}


def reference_tokens(
    family: str, model_dir: str, quantization: str | None, kv_fp8: bool, prompt: tuple[int, ...], params: SamplingParams
) -> tuple[int, ...]:
    """The family's reference answer to one prompt (n = 1; a seeded request draws from its own generator)."""
    key = repr((family, model_dir, quantization, kv_fp8, prompt, params))
    if key not in _ANSWERS:
        _ANSWERS[key] = _decode(family, model_dir, quantization, kv_fp8, prompt, params)
    return _ANSWERS[key]


def _decode(
    family: str, model_dir: str, quantization: str | None, kv_fp8: bool, prompt: tuple[int, ...], params: SamplingParams
) -> tuple[int, ...]:
    model = _reference_model(family, model_dir, quantization)
    kind = FAMILIES[family].reference
    generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
    with _kv_context(family, kv_fp8):
        if kind == "recompute":
            return tuple(reference_generate(model, list(prompt), params, generator).token_ids)
        if kind == "transformers":
            return tuple(_transformers_tokens(model, list(prompt), params))
        if kind == "clover" and params.decoder != "verified":
            return tuple(reference_hybrid_generate(DenseClover(model.model), model, list(prompt), params, generator))
        assert params.max_tokens is not None
        settings = ReferenceSettings(max_new_tokens=params.max_tokens, temperature=params.temperature or 0.0)
        return tuple(reference_ar_decode(DenseClover(model.model), list(prompt), settings, generator))


def _transformers_tokens(model: Any, prompt: list[int], params: SamplingParams) -> list[int]:
    """transformers' generate with the request's seed, cut as the API cuts it (at the first EOS, max_tokens)."""
    from diffuserve.reference.diffusion_gemma_hf import recorded_generate

    assert params.seed is not None and params.max_tokens is not None, "DiffusionGemma cells are seeded"
    sequences, _ = recorded_generate(model, prompt, params.seed, max_new_tokens=params.max_tokens)
    generated = sequences[0, len(prompt) :].tolist()[: params.max_tokens]
    eos = model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    end = next((i + 1 for i, t in enumerate(generated) if t in stops), len(generated))
    return generated[:end]
