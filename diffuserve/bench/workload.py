"""What every offline benchmark runs: the model directory and the prompts.

Owns the benchmark model (`sdar-moe-bench`, the random-weight shape every benchmark uses, written once into a
cache directory with fixed seeds) and the seeded random prompts. Knows nothing of timing or the engine.

The random model's LM head is scaled so that confidence-threshold decoding behaves like a trained model's:
with init_std 0.1 and logit_scale 3.5 it accepts about 2.8 tokens per forward at block 32 and threshold 0.9
(1.1 at block 4), and the proposals stay varied instead of collapsing into one repeated token. Plain
initialisation (std 0.02, logit_scale 1) accepts exactly one token per step, which would hide every effect of
parallel decoding.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

BENCH_PRESET = "sdar-moe-bench"
SMALL_PRESETS = ("sdar-moe-tiny", "llada2-tiny", "llada2-bench")
"""The tiny shapes of the SDAR and LLaDA2 families (the test shapes), for sweeps that must finish on a few CPU cores,
and LLaDA2's bench shape (sdar-moe-bench's size)."""


@dataclass(frozen=True)
class BenchModel:
    """How the random benchmark model is generated: changing any field writes a different directory."""

    seed: int = 0
    init_std: float = 0.1
    logit_scale: float = 3.5

    @property
    def dir_name(self) -> str:
        return f"{BENCH_PRESET}-seed{self.seed}-std{self.init_std:g}-scale{self.logit_scale:g}"


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "diffuserve"


def prepare_model(model: str | None, cache_dir: str | Path | None = None, spec: BenchModel | None = None) -> Path:
    """`model` if given (a model directory, or the name of a random shape: clover_moe's `clover-moe-bench`,
    DiffusionGemma's `diffusiongemma-bench`, LLaDA2's `llada2-bench`, the tiny test shapes of SMALL_PRESETS and the
    other families; written on first use), else the sdar-moe-bench checkpoint, written on first use."""
    from diffuserve.reference.clover_moe_checkpoint import CLOVER_MOE_PRESETS
    from diffuserve.reference.diffusion_gemma_checkpoint import DIFFUSION_GEMMA_PRESETS

    if model in DIFFUSION_GEMMA_PRESETS:
        spec = spec or BenchModel()
        path = Path(cache_dir or default_cache_dir()) / f"{model}-seed{spec.seed}"
        if not (path / "config.json").is_file():
            _write_diffusion_gemma_model(path, model, spec)
        return path
    if model in SMALL_PRESETS:
        spec = spec or BenchModel()
        path = Path(cache_dir or default_cache_dir()) / spec.dir_name.replace(BENCH_PRESET, model, 1)
        if not (path / "config.json").is_file():
            _write_small_model(path, model, spec)
        return path
    if model in CLOVER_MOE_PRESETS:
        spec = spec or BenchModel()
        path = Path(cache_dir or default_cache_dir()) / spec.dir_name.replace(BENCH_PRESET, model, 1)
        if not (path / "config.json").is_file():
            _write_clover_moe_model(path, model, spec)
        return path
    if model:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model: {model} has no config.json; pass a model directory or omit --model")
        return path
    spec = spec or BenchModel()
    path = Path(cache_dir or default_cache_dir()) / spec.dir_name
    if not (path / "config.json").is_file():
        _write_bench_model(path, spec)
    return path


def _write_bench_model(path: Path, spec: BenchModel) -> None:
    from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

    # Written under a temporary name and renamed, so an interrupted run never leaves half a checkpoint.
    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    write_random_checkpoint(
        partial, make_config(BENCH_PRESET), seed=spec.seed, init_std=spec.init_std, logit_scale=spec.logit_scale
    )
    partial.rename(path)


def _write_small_model(path: Path, preset: str, spec: BenchModel) -> None:
    from diffuserve.reference.llada2_checkpoint import LLADA2_PRESETS, write_llada2_checkpoint
    from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    if preset in LLADA2_PRESETS:
        shape = LLADA2_PRESETS[preset]
        write_llada2_checkpoint(partial, shape, seed=spec.seed, init_std=spec.init_std, logit_scale=spec.logit_scale)
    else:
        write_random_checkpoint(
            partial, make_config(preset), seed=spec.seed, init_std=spec.init_std, logit_scale=spec.logit_scale
        )
    partial.rename(path)


def _write_clover_moe_model(path: Path, preset: str, spec: BenchModel) -> None:
    from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    write_clover_moe_checkpoint(
        partial, make_clover_moe_config(preset), seed=spec.seed, init_std=spec.init_std, logit_scale=spec.logit_scale
    )
    partial.rename(path)


def _write_diffusion_gemma_model(path: Path, preset: str, spec: BenchModel) -> None:
    """The weights' scales are the shape's own (a confident head with a damped self-conditioning loop), not the
    sdar bench's `init_std` / `logit_scale`: only the seed varies."""
    from diffuserve.reference.diffusion_gemma_checkpoint import (
        make_diffusion_gemma_config,
        write_diffusion_gemma_checkpoint,
    )

    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    write_diffusion_gemma_checkpoint(partial, make_diffusion_gemma_config(preset), seed=spec.seed, feedback=0.1)
    partial.rename(path)


def random_prompts(
    num_prompts: int, num_tokens: int, vocab_size: int, seed: int, exclude: frozenset[int] = frozenset()
) -> list[list[int]]:
    """Seeded random token ids, none in `exclude` (pass the model's mask and stop ids, so that no prompt ends
    early or carries a mask). Prompt i is the same whatever `num_prompts` is, so a run with more prompts
    extends a run with fewer."""
    allowed = [t for t in range(vocab_size) if t not in exclude]
    return [random.Random(f"{seed}:{i}").choices(allowed, k=num_tokens) for i in range(num_prompts)]
