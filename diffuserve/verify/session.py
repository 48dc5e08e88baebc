"""One `diffuserve verify` run: the engine's model (through the engine's own loader) and the reference, both built
from the same directory (or the same `--layers K` view of it), compared on fixed prompts. Knows the order of the
checks, not how each is made.
"""

from __future__ import annotations

import contextlib
import sys
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
from diffuserve.verify.block_steps import block_steps_check, find_entry, load_generate_file, reference_block
from diffuserve.verify.canvas import OursCanvasRunner, ReferenceCanvasRunner, canvas_ids
from diffuserve.verify.compare import GreedyCheck, layer_checks, logits_check
from diffuserve.verify.conventions import ConventionChoice, choose_convention
from diffuserve.verify.layer_view import write_layer_view
from diffuserve.verify.reference import Reference, choose_reference
from diffuserve.verify.report import VerifyResult
from diffuserve.verify.runners import CausalRun, OursRunner, ReferenceRunner
from diffuserve.verify.stand_ins import standing_in

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
    reference_generate: str | None = None
    """FILE[:FUNCTION]: the reference's block-diffusion loop outside the model (SDAR's generate.py)."""


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
        try:
            return _compare(options, model_dir, family, reference)
        except ReferenceUnavailable as e:
            return VerifyResult(options.model, options.dtype, options.layers, None, str(e))


@dataclass(frozen=True)
class _ReferenceSide:
    notes: list[str]
    choice: ConventionChoice
    greedy: list[list[int]]
    found: tuple[str, ...]
    entry: str
    block: tuple[list[int] | None, str, tuple[str, ...]] | None


def _compare(options: VerifyOptions, model_dir: Path, family: str, reference: Reference) -> VerifyResult:
    """The engine's runs first, then the reference's (one model in memory at a time), then the block step."""
    if family == "diffusion_gemma":
        return _compare_canvas(options, model_dir, reference)
    args, ours_model = load_model(model_dir, dtype=options.dtype, device=options.device)
    dtype = resolve_dtype(options.dtype, args)
    ours = OursRunner(ours_model, torch.device(options.device))
    prompts = prompt_ids(model_dir, args.vocab_size)
    ours_runs = [ours.run(p) for p in prompts]
    ours_greedy = [_greedy(ours, p, options.max_new_tokens) for p in prompts]
    del ours, ours_model
    eos_id = args.eos_token_ids[0] if args.eos_token_ids else None
    side = _reference_side(options, model_dir, family, reference, args, dtype, prompts, ours_runs)
    return VerifyResult(
        model=options.model,
        dtype=str(dtype).removeprefix("torch."),
        layers=options.layers,
        reference=reference.name,
        notes=[*side.notes, side.choice.note],
        layer_checks=side.choice.layer_checks,
        logits=side.choice.logits,
        greedy=[GreedyCheck(i, a, b) for i, (a, b) in enumerate(zip(ours_greedy, side.greedy))],
        block_steps=block_steps_check(
            side.found,
            side.block,
            side.entry,
            lambda prompt, length, threshold: _engine_block(model_dir, options, prompt, length, threshold),
            prompts[0],
            args.block_length,
            eos_id,
        ),
    )


def _reference_side(
    options: VerifyOptions,
    model_dir: Path,
    family: str,
    reference: Reference,
    args: ModelArgs,
    dtype: torch.dtype,
    prompts: list[list[int]],
    ours_runs: list[CausalRun],
) -> _ReferenceSide:
    """The reference built and run with the stand-ins its files need: its layers (in the mask convention that
    agrees), its greedy continuations and its block loop's tokens."""
    device = torch.device(options.device)
    sources = _sources(model_dir, options.reference_generate) if reference.remote_code else []
    # the reference's own prints (transformers' docstring checks of remote code print to stdout) go to stderr:
    # stdout is verify's table or its one JSON document
    with contextlib.redirect_stdout(sys.stderr), standing_in(sources) as stood_in:
        hf_model, notes = _build(reference, model_dir, dtype)
        hf_model = hf_model.to(device)
        choice = choose_convention(
            lambda convention: ReferenceRunner(hf_model, args.num_layers, device, convention),
            prompts,
            ours_runs,
            layer_names(args, family),
            dtype,
            recurrent=family == "clover_moe",
        )
        greedy = [_greedy(choice.runner, p, options.max_new_tokens) for p in prompts]
        generate_fn = load_generate_file(options.reference_generate) if options.reference_generate else None
        entry, found = find_entry(hf_model, generate_fn)
        block = None
        if entry is not None:
            eos_id = args.eos_token_ids[0] if args.eos_token_ids else None
            block = reference_block(hf_model, entry, prompts[0], args.block_length, args.mask_token_id, eos_id)
    notes += [f"stood in for {line}" for line in stood_in]
    return _ReferenceSide(notes, choice, greedy, found, entry.name if entry else "", block)


def _compare_canvas(options: VerifyOptions, model_dir: Path, reference: Reference) -> VerifyResult:
    """DiffusionGemma: one canvas forward after each prompt, every layer and the canvas's logits (canvas.py)."""
    device = torch.device(options.device)
    args, ours_model = load_model(model_dir, dtype=options.dtype, device=options.device)
    dtype = resolve_dtype(options.dtype, args)
    prompts = prompt_ids(model_dir, args.vocab_size)
    canvases = canvas_ids(args.vocab_size, args.block_length, len(prompts))
    ours = OursCanvasRunner(ours_model, args, device)
    ours_runs = [ours.run(p, c) for p, c in zip(prompts, canvases)]
    del ours, ours_model
    hf_model, notes = _build(reference, model_dir, dtype)
    theirs = ReferenceCanvasRunner(hf_model.to(device), device)
    reference_runs = [theirs.run(p, c) for p, c in zip(prompts, canvases)]
    names = [f"layer {i} (prompt: encoder, canvas: decoder)" for i in range(args.num_layers)]
    return VerifyResult(
        model=options.model,
        dtype=str(dtype).removeprefix("torch."),
        layers=options.layers,
        reference=reference.name,
        notes=[*notes, f"compared: one denoising forward of a {args.block_length}-token canvas after each prompt"],
        layer_checks=layer_checks(ours_runs, reference_runs, names, dtype),
        logits=logits_check(ours_runs, reference_runs, dtype, what="canvas logits"),
    )


class ReferenceUnavailable(Exception):
    """The reference's code cannot be imported here (a name its files import is missing)."""


def _build(reference: Reference, model_dir: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, list[str]]:
    import transformers

    try:
        return reference.build(model_dir, dtype)
    except ImportError as e:
        raise ReferenceUnavailable(
            f"{reference.name} cannot be imported under transformers {transformers.__version__}: {e}"
        ) from e


def _sources(model_dir: Path, reference_generate: str | None) -> list[str]:
    """The text of the checkpoint's own Python files and of the named generate file: what stand-ins may serve."""
    files = sorted(model_dir.glob("*.py"))
    if reference_generate:
        files.append(Path(reference_generate.partition(":")[0]))
    return [f.read_text() for f in files if f.is_file()]


def _engine_block(
    model_dir: Path, options: VerifyOptions, prompt: list[int], block_length: int, threshold: float
) -> list[int]:
    """The engine's greedy tokens for one block after `prompt` (its threshold decoder, default steps)."""
    from diffuserve import LLM
    from diffuserve.sampling_params import SamplingParams

    llm = LLM(str(model_dir), dtype=options.dtype, device=options.device, block_length=block_length)
    params = SamplingParams(max_tokens=block_length, temperature=0.0, decoder="threshold", threshold=threshold)
    return list(llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)
