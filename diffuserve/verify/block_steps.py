"""One block of block-diffusion decoding on both sides, where the reference exposes an entry point for it.

Entry points looked for: a block-diffusion `generate` taking `block_length` (LLaDA2's and dFactory's, whose
keywords are `block_length`, `gen_length`, `steps`, `threshold`, `temperature`, `mask_id`, `eos_id`), Dream's
whole-sequence `diffusion_generate` and a `forward_preview`. Only the first is driven: one block (`gen_length` =
the block length, `steps` = the block length, threshold BLOCK_THRESHOLD, temperature 0; only the keywords its
signature has) against the engine's `LLM.generate` with the same settings (`max_tokens` = the block length;
the engine's threshold decoder falls back to its top-k schedule as LLaDA2's loop does), token for token. A
reference that returns the prompt ahead of the block has it cut off. A call that raises is reported, not
compared. Knows nothing of how the engine is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

ENTRY_POINTS = ("generate(block_length=...)", "diffusion_generate", "forward_preview")
BLOCK_THRESHOLD = 0.9


@dataclass(frozen=True)
class BlockStepsCheck:
    tried: tuple[str, ...]
    found: tuple[str, ...]
    ours: list[int] | None = None
    reference: list[int] | None = None
    error: str = ""

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
            tokens = len(self.ours or [])
            return f"one block through the reference's generate(block_length=...), {tokens} tokens: {verdict}"
        if self.error:
            return f"not compared: {self.error}"
        if self.found:
            return f"not compared: the reference exposes {', '.join(self.found)}, which verify does not drive yet"
        return f"not compared: the reference exposes none of {', '.join(self.tried)}"


def _block_generate_parameters(model: nn.Module) -> set[str] | None:
    """The keyword names of the model's block-diffusion `generate` (None: it has none)."""
    generate = getattr(model, "generate", None)
    try:
        parameters = set(inspect.signature(generate).parameters) if generate is not None else set()
    except (TypeError, ValueError):  # a callable without a readable signature
        return None
    return parameters if "block_length" in parameters else None


EngineBlock = Callable[[list[int], int, float], list[int]]
"""(prompt, block length, threshold) -> the engine's greedy tokens for one block."""


def block_steps_check(
    model: nn.Module, engine_block: EngineBlock, prompt: list[int], block_length: int, mask_id: int, eos_id: int | None
) -> BlockStepsCheck:
    parameters = _block_generate_parameters(model)
    present = (parameters is not None, hasattr(model, "diffusion_generate"), hasattr(model, "forward_preview"))
    found = tuple(name for name, has in zip(ENTRY_POINTS, present) if has)
    if parameters is None:
        return BlockStepsCheck(ENTRY_POINTS, found)
    wanted = dict(
        block_length=block_length,
        gen_length=block_length,
        steps=block_length,
        threshold=BLOCK_THRESHOLD,
        temperature=0.0,
        mask_id=mask_id,
        eos_id=eos_id,
    )
    kwargs = {k: v for k, v in wanted.items() if k in parameters and v is not None}
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            out = getattr(model, "generate")(torch.tensor([prompt], device=device), **kwargs)  # noqa: B009
    except (TypeError, ValueError, RuntimeError, IndexError) as e:
        return BlockStepsCheck(ENTRY_POINTS, found, error=f"generate(block_length=...) raised {type(e).__name__}: {e}")
    tokens = (out[0] if isinstance(out, torch.Tensor) else torch.as_tensor(out[0])).tolist()
    if len(tokens) > block_length and tokens[: len(prompt)] == prompt:
        tokens = tokens[len(prompt) :]
    return BlockStepsCheck(ENTRY_POINTS, found, engine_block(prompt, block_length, BLOCK_THRESHOLD), tokens)
