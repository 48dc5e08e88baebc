"""One block of block-diffusion decoding through the reference's own loop, where it has one.

Entry points looked for: the model's block-diffusion `generate` taking `block_length` (LLaDA2's, dFactory's), a
function of a file the user names (`--reference-generate FILE[:FUNCTION]`: SDAR's `generate.py`,
`block_diffusion_generate(model, prompt, ...)`), Dream's whole-sequence `diffusion_generate` and a
`forward_preview` (named, not driven). The loop runs one block (`gen_length` = `steps` = the block length,
threshold BLOCK_THRESHOLD, temperature 0, the low-confidence threshold rule with the top-k fallback; only the
keywords its signature has, by either of their published names), as released, with three things made exact and
said: a sampler that draws with `torch.multinomial` at temperature 0 has each draw read as its argmax (a sampler
that divides by the temperature is called at temperature 1 instead, where the draw's probability is the greedy
confidence); a floating attention mask of another dtype than the model's (dFactory's bfloat16 0 / -inf) is cast
to the model's dtype at the forward (0, 1 and -inf are exact in every float dtype); a forward called without
`use_cache` runs with `use_cache=False`. Its tokens after the prompt, to the first EOS, are what is compared with
the engine's. Knows nothing of how the engine is built.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

ENTRY_POINTS = ("generate(block_length=...)", "diffusion_generate", "forward_preview")
BLOCK_THRESHOLD = 0.9
SYNONYMS = {
    "gen_length": "length",
    "block_length": "length",
    "steps": "length",
    "denoising_steps": "length",
    "threshold": "threshold",
    "confidence_threshold": "threshold",
    "temperature": "temperature",
    "mask_id": "mask_id",
    "eos_id": "eos_id",
    "stopping_criteria_idx": "eos_ids",
    "remasking_strategy": "rule",
}
"""A loop's keyword -> the setting it carries (LLaDA2's and SDAR's names)."""


@dataclass(frozen=True)
class BlockEntry:
    name: str
    call: Callable[..., Any]
    """(prompt, **keywords) -> the loop's output."""
    parameters: set[str]


@dataclass(frozen=True)
class BlockStepsCheck:
    tried: tuple[str, ...]
    found: tuple[str, ...]
    ours: list[int] | None = None
    reference: list[int] | None = None
    error: str = ""
    entry: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """How the loop was made exact (its sampler, its mask's dtype), said in the report."""

    @property
    def compared(self) -> bool:
        return self.ours is not None and self.reference is not None

    @property
    def agrees(self) -> bool:
        return not self.compared or self.ours == self.reference

    @property
    def summary(self) -> str:
        if self.compared:
            verdict = "identical" if self.agrees else f"PART: {self.ours} vs reference {self.reference}"
            return f"one block through the reference's {self.entry}, {len(self.reference or [])} tokens: {verdict}"
        if self.error:
            return f"not compared: {self.error}"
        if self.found:
            return f"not compared: the reference exposes {', '.join(self.found)}, which verify does not drive yet"
        return f"not compared: the reference exposes none of {', '.join(self.tried)}"


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a callable without a readable signature
        return set()


def load_generate_file(spec: str) -> Callable[..., Any]:
    """`FILE[:FUNCTION]` -> the function (without FUNCTION: the file's one function taking `model` and
    `block_length`); a ValueError naming the file otherwise."""
    path, _, wanted = spec.partition(":")
    if not Path(path).is_file():
        raise ValueError(f"--reference-generate: no file {path}; give FILE[:FUNCTION] (e.g. SDAR's generate.py)")
    module_spec = importlib.util.spec_from_file_location(f"diffuserve_reference_generate_{abs(hash(path))}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    found = [
        name
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and (name == wanted or (not wanted and {"model", "block_length"} <= _parameters(fn)))
    ]
    if len(found) != 1:
        raise ValueError(
            f"--reference-generate {spec}: {len(found)} functions match; name one as FILE:FUNCTION "
            "(a block-diffusion loop taking model and block_length)"
        )
    return getattr(module, found[0])


def find_entry(model: nn.Module, generate_fn: Callable[..., Any] | None) -> tuple[BlockEntry | None, tuple[str, ...]]:
    """(the loop verify drives, or None; every entry point the reference exposes)."""
    generate = getattr(model, "generate", None)
    method = _parameters(generate) if generate is not None else set()
    found = tuple(
        name
        for name, has in zip(
            ENTRY_POINTS,
            ("block_length" in method, hasattr(model, "diffusion_generate"), hasattr(model, "forward_preview")),
        )
        if has
    )
    if generate_fn is not None:
        name = f"{generate_fn.__name__} of {Path(inspect.getfile(inspect.unwrap(generate_fn))).name}"
        entry = BlockEntry(name, lambda prompt, **kw: generate_fn(model, prompt, **kw), _parameters(generate_fn))
        return entry, (name, *found)
    if generate is not None and "block_length" in method:
        return BlockEntry(ENTRY_POINTS[0], generate, method), found
    return None, found


class _NanDraw(Exception):
    """The sampler drew from NaN probabilities (it divided by temperature 0)."""


@contextmanager
def _exact(model: nn.Module, notes: list[str]) -> Iterator[None]:
    """torch.multinomial read as argmax, the attention mask in the model's dtype, use_cache off when unasked."""
    dtype = next(model.parameters()).dtype
    multinomial, forward = torch.multinomial, model.forward

    def argmax_draw(probs: torch.Tensor, num_samples: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if num_samples != 1:
            raise NotImplementedError(f"verify reads one draw as the argmax; the loop draws {num_samples}")
        if torch.isnan(probs).any():
            raise _NanDraw
        _say(
            notes,
            "its sampler draws with torch.multinomial even for temperature 0: each draw was read as its argmax "
            "(the greedy token; its probability is the confidence)",
        )
        return probs.argmax(-1, keepdim=True)

    def exact_forward(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.dtype != dtype:
            _say(notes, f"it passes a {str(mask.dtype)[6:]} attention mask: cast to {str(dtype)[6:]} at the forward")
            kwargs["attention_mask"] = mask.to(dtype)
        kwargs.setdefault("use_cache", False)
        return forward(*args, **kwargs)

    torch.multinomial = argmax_draw  # type: ignore[assignment]
    model.forward = exact_forward
    try:
        yield
    finally:
        torch.multinomial = multinomial
        del model.forward  # the instance attribute: the class's forward again


def _say(notes: list[str], line: str) -> None:
    if line not in notes:
        notes.append(line)


def _call(entry: BlockEntry, prompt: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    """The loop on the prompt as a tensor, or as the tokenizer's dict where the loop reads `prompt['input_ids']`."""
    try:
        return entry.call(prompt, **kwargs)
    except IndexError:
        return entry.call({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}, **kwargs)


def _to_first_eos(tokens: list[int], eos_id: int | None) -> list[int]:
    return tokens[: tokens.index(eos_id) + 1] if eos_id is not None and eos_id in tokens else tokens


def reference_block(
    model: nn.Module, entry: BlockEntry, prompt: list[int], length: int, mask_id: int, eos_id: int | None
) -> tuple[list[int] | None, str, tuple[str, ...]]:
    """(the loop's tokens for one block after `prompt`, to the first EOS, or None; why not; the notes)."""
    settings: dict[str, Any] = dict(
        length=length,
        threshold=BLOCK_THRESHOLD,
        temperature=0.0,
        mask_id=mask_id,
        eos_id=eos_id,
        eos_ids=None if eos_id is None else [eos_id],
        rule="low_confidence_dynamic",
    )
    kwargs = {k: settings[v] for k, v in SYNONYMS.items() if k in entry.parameters and settings[v] is not None}
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    notes: list[str] = []
    try:
        with torch.no_grad(), _exact(model, notes):
            try:
                out = _call(entry, ids, kwargs)
            except _NanDraw:
                notes.clear()
                notes.append("its sampler divides by the temperature (0 gives NaN): called at temperature 1")
                out = _call(entry, ids, {**kwargs, "temperature": 1.0})
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, NotImplementedError, _NanDraw) as e:
        return None, f"{entry.name} raised {type(e).__name__}: {e}", tuple(notes)
    # a [1, L] tensor, or a tuple led by one (dMoE's generate returns the experts it used beside its tokens)
    ids = torch.as_tensor(out[0] if isinstance(out, (tuple, list)) else out)
    tokens = (ids[0] if ids.dim() == 2 else ids).tolist()
    if len(tokens) > length and tokens[: len(prompt)] == prompt:
        tokens = tokens[len(prompt) :]
    return _to_first_eos(tokens[:length], eos_id), "", tuple(notes)


EngineBlock = Callable[[list[int], int, float], list[int]]
"""(prompt, block length, threshold) -> the engine's greedy tokens for one block."""


def block_steps_check(
    found: tuple[str, ...],
    reference: tuple[list[int] | None, str, tuple[str, ...]] | None,
    entry: str,
    engine_block: EngineBlock,
    prompt: list[int],
    length: int,
    eos_id: int | None,
) -> BlockStepsCheck:
    """The check, from the reference's block (None: no loop to drive) and, where it ran, the engine's."""
    if reference is None:
        return BlockStepsCheck(ENTRY_POINTS, found)
    tokens, error, notes = reference
    if tokens is None:
        return BlockStepsCheck(ENTRY_POINTS, found, error=error, entry=entry, notes=notes)
    ours = _to_first_eos(engine_block(prompt, length, BLOCK_THRESHOLD), eos_id)
    return BlockStepsCheck(ENTRY_POINTS, found, ours, tokens, entry=entry, notes=notes)
