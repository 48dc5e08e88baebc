"""The block-diffusion entry points a reference model may expose, for `diffuserve verify`'s last row.

A checkpoint's own code may carry a block-diffusion `generate` (LLaDA2's and dFactory's take `block_length`,
`gen_length`, `steps`, `threshold`), a whole-sequence `diffusion_generate` (Dream's) or a preview forward;
transformers' built-in causal classes carry none. verify names the ones it looked for and the ones it found; it
does not drive any of them yet, so one block's denoising steps are reported as not compared. Knows nothing of
the engine.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

ENTRY_POINTS = ("generate(block_length=...)", "diffusion_generate", "forward_preview")


@dataclass(frozen=True)
class BlockStepsCheck:
    tried: tuple[str, ...]
    found: tuple[str, ...]

    @property
    def summary(self) -> str:
        if self.found:
            return f"not compared: the reference exposes {', '.join(self.found)}, which verify does not drive yet"
        return f"not compared: the reference exposes none of {', '.join(self.tried)}"


def _has_block_generate(model: nn.Module) -> bool:
    generate = getattr(model, "generate", None)
    if generate is None:
        return False
    try:
        return "block_length" in inspect.signature(generate).parameters
    except (TypeError, ValueError):  # a builtin or C-level callable has no readable signature
        return False


def block_steps_check(model: nn.Module) -> BlockStepsCheck:
    found = [
        name
        for name, present in zip(
            ENTRY_POINTS,
            (_has_block_generate(model), hasattr(model, "diffusion_generate"), hasattr(model, "forward_preview")),
        )
        if present
    ]
    return BlockStepsCheck(ENTRY_POINTS, tuple(found))
