"""One `diffuserve verify` run: the engine's model (through the engine's own loader) and the reference, both built
from the same directory (or the same `--layers K` view of it), compared on fixed prompts. Knows the order of the
checks, not how each is made.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    clover_moe_args_from_hf,
    hybrid_args,
)
from diffuserve.model.loader import load_model, read_model_config, resolve_dtype
from diffuserve.model.registry import family_for
from diffuserve.verify.block_steps import block_steps_check
from diffuserve.verify.compare import GreedyCheck, layer_checks, logits_check
from diffuserve.verify.layer_view import write_layer_view
from diffuserve.verify.reference import Reference, choose_reference
from diffuserve.verify.report import VerifyResult
from diffuserve.verify.runners import OursRunner, ReferenceRunner

PROMPT_TEXTS = ("The capital of France is", "def fibonacci(n):\n    ")
RANDOM_PROMPT_LENGTHS = (11, 23)
"""Prompts of seeded random ids, for a directory without a tokenizer.json."""


@dataclass(frozen=True)
class VerifyOptions:
    model: str
    layers: int | None = None
    dtype: str = "auto"
    device: str = "cpu"
    trust_remote_code: bool = False
    max_new_tokens: int = 8


def check_hybrid_layers(config: dict, num_layers: int) -> None:
    """A Clover view must hold a GDN layer and an attention layer: each kind has code of its own to check."""
    types = hybrid_args(clover_moe_args_from_hf(config)).layer_types
    needed = max(types.index(kind) for kind in (LINEAR_ATTENTION, FULL_ATTENTION)) + 1
    if num_layers < needed:
        raise ValueError(
            f"--layers: the first {num_layers} layers miss a {LINEAR_ATTENTION} or a {FULL_ATTENTION} layer; "
            f"pass at least {needed}"
        )


def prompt_ids(model_dir: Path, vocab_size: int) -> list[list[int]]:
    if (model_dir / "tokenizer.json").is_file():
        from diffuserve.text.tokenizer import Tokenizer

        tokenizer = Tokenizer(model_dir)
        prompts = [tokenizer.encode(text, add_special_tokens=False) for text in PROMPT_TEXTS]
        if all(prompts) and all(0 <= i < vocab_size for p in prompts for i in p):
            return prompts
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in RANDOM_PROMPT_LENGTHS]


def layer_names(args: ModelArgs, family: str) -> list[str]:
    if family == "clover_moe":
        return [f"layer {i} ({kind})" for i, kind in enumerate(hybrid_args(args).layer_types)]
    return [f"layer {i}" for i in range(args.num_layers)]


def _greedy(runner: OursRunner | ReferenceRunner, ids: list[int], num_tokens: int) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(num_tokens):
            out.append(int(runner.logits(ids + out)[-1].argmax()))
    return out


def verify(options: VerifyOptions) -> VerifyResult:
    config, _ = read_model_config(options.model)
    family = family_for(config).name
    reference, reason = choose_reference(config, family, options.trust_remote_code)
    if reference is None:
        return VerifyResult(options.model, options.dtype, options.layers, None, reason)
    if options.layers is not None and family == "clover_moe":
        check_hybrid_layers(config, options.layers)
    with tempfile.TemporaryDirectory(prefix="diffuserve-verify-") as scratch:
        model_dir = Path(options.model)
        if options.layers is not None:
            model_dir = write_layer_view(model_dir, options.layers, Path(scratch) / "view")
        return _compare(options, model_dir, family, reference)


def _compare(options: VerifyOptions, model_dir: Path, family: str, reference: Reference) -> VerifyResult:
    device = torch.device(options.device)
    args, ours_model = load_model(model_dir, dtype=options.dtype, device=options.device)
    dtype = resolve_dtype(options.dtype, args)
    hf_model, notes = reference.build(model_dir, dtype)
    ours = OursRunner(ours_model, device)
    theirs = ReferenceRunner(hf_model.to(device), args.num_layers, device, recurrent=family == "clover_moe")
    prompts = prompt_ids(model_dir, args.vocab_size)
    ours_runs = [ours.run(p) for p in prompts]
    reference_runs = [theirs.run(p) for p in prompts]
    greedy = [
        GreedyCheck(i, _greedy(ours, p, options.max_new_tokens), _greedy(theirs, p, options.max_new_tokens))
        for i, p in enumerate(prompts)
    ]
    del ours, ours_model  # the block step builds the engine itself: hold two copies of the model, not three
    return VerifyResult(
        model=options.model,
        dtype=str(dtype).removeprefix("torch."),
        layers=options.layers,
        reference=reference.name,
        notes=notes,
        layer_checks=layer_checks(ours_runs, reference_runs, layer_names(args, family), dtype),
        logits=logits_check(ours_runs, reference_runs, dtype),
        greedy=greedy,
        block_steps=block_steps_check(
            hf_model,
            lambda prompt, length, threshold: _engine_block(model_dir, options, prompt, length, threshold),
            prompts[0],
            args.block_length,
            args.mask_token_id,
            args.eos_token_ids[0] if args.eos_token_ids else None,
        ),
    )


def _engine_block(
    model_dir: Path, options: VerifyOptions, prompt: list[int], block_length: int, threshold: float
) -> list[int]:
    """The engine's greedy tokens for one block after `prompt` (its threshold decoder, default steps)."""
    from diffuserve import LLM
    from diffuserve.sampling_params import SamplingParams

    llm = LLM(str(model_dir), dtype=options.dtype, device=options.device, block_length=block_length)
    params = SamplingParams(max_tokens=block_length, temperature=0.0, decoder="threshold", threshold=threshold)
    return list(llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)
